//! A `__partitioned__` description of a [rows, dim] array split along rows over MPI ranks, as
//! one rank passes it: every partition's start, shape and owners, data only where this rank is
//! an owner (Heat's SPMD form).
#![allow(dead_code)]

use crate::common::*;
use dlpark::ffi::{DLDataType, DLTensor};
use std::ptr::{null, null_mut};

pub struct Split {
    pub shape: [i64; 2],
    pub tiling: [i64; 2],
    pub starts: Vec<[i64; 2]>,
    pub sizes: Vec<[i64; 2]>,
    pub owners: Vec<Vec<PartitionLocation>>,
    /// This rank's data per partition (None where it is not an owner).
    pub data: Vec<Option<Desc>>,
    /// SPMD `locals`: this rank's grid positions as (row, 0) pairs, or None (NULL).
    pub locals: Option<Vec<i64>>,
    parts: Vec<Partition>,
    c: Option<Partitioned>,
}

pub fn at(rank: i32) -> PartitionLocation {
    PartitionLocation { rank, ..strata_partition_location_default() }
}

impl Split {
    /// `rows[p]` rows in partition p, owned by `owners[p]`, over `global` (compact
    /// [sum(rows), dim] elements of `dtype`); `rank` gets views of its own partitions.
    pub fn new(global: &[u8], dtype: DLDataType, dim: usize, rows: &[i64], owners: &[Vec<i32>], rank: i32) -> Split {
        let row_bytes = dim * elem_size(dtype);
        Split::with_data(dtype, dim, rows, owners, rank, |start| global[(start as usize * row_bytes).min(global.len())..].as_ptr())
    }

    /// As [`Split::new`], with `data(start)` the compact memory of the local partition starting
    /// at global row `start`.
    pub fn with_data(
        dtype: DLDataType,
        dim: usize,
        rows: &[i64],
        owners: &[Vec<i32>],
        rank: i32,
        data: impl Fn(i64) -> *const u8,
    ) -> Split {
        let mut s = Split {
            shape: [rows.iter().sum(), dim as i64],
            tiling: [rows.len() as i64, 1],
            starts: vec![],
            sizes: vec![],
            owners: vec![],
            data: vec![],
            locals: None,
            parts: vec![],
            c: None,
        };
        let mut start = 0i64;
        for (p, &n) in rows.iter().enumerate() {
            s.starts.push([start, 0]);
            s.sizes.push([n, dim as i64]);
            s.owners.push(owners[p].iter().map(|&r| at(r)).collect());
            s.data.push(owners[p].contains(&rank).then(|| Desc::compact(data(start), dtype, &[n, dim as i64])));
            start += n;
        }
        s
    }

    /// The C description (valid while `self` lives and is not changed).
    pub fn c(&mut self) -> *const Partitioned {
        self.parts = (0..self.starts.len())
            .map(|i| Partition {
                start: self.starts[i].as_ptr(),
                shape: self.sizes[i].as_ptr(),
                data: self.data[i].as_ref().map_or(null(), |d| &d.t as *const DLTensor),
                handle: null_mut(),
                locations: self.owners[i].as_ptr(),
                num_locations: self.owners[i].len() as i32,
                ..strata_partition_default()
            })
            .collect();
        self.c = Some(Partitioned {
            ndim: 2,
            shape: self.shape.as_ptr(),
            partition_tiling: self.tiling.as_ptr(),
            partitions: self.parts.as_ptr(),
            locals: self.locals.as_ref().map_or(null(), |l| l.as_ptr()),
            num_locals: self.locals.as_ref().map_or(0, |l| l.len() as i32 / 2),
            ..strata_partitioned_default()
        });
        self.c.as_ref().unwrap()
    }
}
