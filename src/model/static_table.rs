//! Static tables: vectors in a [`Store`] plus how keys find rows (dense, or a [`KeyIndex`]),
//! the default row for missing keys and what a missing key means. Built by copy, by adoption or
//! from a HugeCTR folder, then immutable: any number of threads may look one up at once.

use super::options::{GpuOptions, MissingKey, TableOptions};
use crate::dlpack::{FloatDtype, KeyDtype, TensorView, Vouched, require_host};
use crate::error::{Error, Result};
use crate::kernels::{RowFormat, quantize_row};
use crate::limits::MAX_DIM;
use crate::storage::hugectr::SparseFolder;
use crate::storage::index::KeyIndex;
use crate::storage::store::Store;
use dlpark::ManagedTensorBase;
use dlpark::ffi::DLTensor;
use std::path::Path;

/// How keys map to rows.
pub(crate) enum Rows {
    /// Key `k` is row `k` for `0 <= k < rows`.
    Dense,
    /// Arbitrary 64-bit keys.
    Keyed(KeyIndex),
}

/// An immutable embedding table: vectors in a [`Store`] and dense or keyed rows. Built by
/// copy, by adoption or from a HugeCTR folder; any number of threads may look it up at once.
pub struct StaticTable {
    pub(crate) store: Store,
    pub(crate) rows: Rows,
    /// The default row: `dim` copies of `options.default_value`, in float32 whatever the
    /// table's dtype, so a missing key gets exactly the value asked for.
    default_row: Vec<f32>,
    pub(crate) missing: MissingKey,
    /// Where lookups on CUDA tensors find rows (kept for [`Table`]).
    pub(crate) gpu: GpuOptions,
}

impl StaticTable {
    fn assemble(store: Store, rows: Rows, options: TableOptions) -> Result<Self> {
        options.gpu.check()?;
        let default_row = vec![options.default_value; store.dim()];
        Ok(StaticTable { store, rows, default_row, missing: options.missing, gpu: options.gpu })
    }

    /// A dense table (key = row number) over `store`.
    pub(crate) fn dense_over(store: Store, options: TableOptions) -> Result<Self> {
        StaticTable::assemble(store, Rows::Dense, options)
    }

    /// A keyed table over `store`, row `r` holding the key `index` maps to `r`.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn keyed_over(store: Store, index: KeyIndex, options: TableOptions) -> Result<Self> {
        StaticTable::assemble(store, Rows::Keyed(index), options)
    }

    /// Copies `vectors` ([rows, dim], float32/float16/bfloat16, any strides, host memory) into
    /// a new table, stored as `options.storage` (quantized or converted row by row; `None`
    /// stores the dtype given). Already quantized rows come as uint8 `[rows, row_bytes]` in
    /// the fused layout of `options.storage` and are copied as they are. `keys` is `None` for
    /// a dense table, else a 1-D tensor of `rows` unique integer keys. The caller's tensors are
    /// only read during the call.
    ///
    /// # Safety
    /// The tensors must describe readable host memory as DLPack requires.
    pub unsafe fn from_dlpack(vectors: &DLTensor, keys: Option<&DLTensor>, options: TableOptions) -> Result<Self> {
        options.gpu.check()?;
        // SAFETY: the caller guarantees vectors describes readable host memory as DLPack
        // requires, so its shape and strides are readable for ndim elements.
        let v = unsafe { TensorView::new(vectors, "vectors") }?;
        let (given, rows, dim) = check_vectors(&v, options.storage)?;
        let format = options.storage.unwrap_or(given);
        // SAFETY: the caller guarantees the same of keys.
        let index = unsafe { build_rows(keys, rows) }?;
        let (rs, cs) = (v.strides[0], v.strides[1]);
        if format != given {
            let dtype = given.float().expect("check_vectors: a conversion starts from floats");
            let store = quantized_store(format, rows, dim, |r, row| {
                for (c, x) in row.iter_mut().enumerate() {
                    // SAFETY: element (r, c) is inside the view (r < rows, c < dim), which
                    // validated every element addressable and aligned; the caller guarantees it
                    // is readable.
                    *x = unsafe { dtype.load_f32(v.at(r as isize * rs + c as isize * cs)) };
                }
            })?;
            return StaticTable::assemble(store, index, options);
        }
        // The rows as given: `size` bytes an element (a quantized row is bytes).
        let (size, dim_elems) = match format.float() {
            Some(d) => (d.size(), dim),
            None => (1, format.row_bytes(dim)),
        };
        let store = Store::alloc(format, rows, dim, |buf| {
            let dim = dim_elems;
            for r in 0..rows {
                let dst = &mut buf[r * dim * size..(r + 1) * dim * size];
                let row = r as isize * rs;
                if cs == 1 {
                    // SAFETY: the view validated that every element is addressable.
                    let src = unsafe { std::slice::from_raw_parts(v.at(row), dim * size) };
                    dst.copy_from_slice(src);
                } else {
                    for c in 0..dim {
                        // SAFETY: element (r, c) is inside the view (r < rows, c < dim), which
                        // validated every element addressable and aligned; the caller guarantees
                        // it is readable.
                        let src = unsafe { std::slice::from_raw_parts(v.at(row + c as isize * cs), size) };
                        dst[c * size..(c + 1) * size].copy_from_slice(src);
                    }
                }
            }
            Ok(())
        })?;
        StaticTable::assemble(store, index, options)
    }

    /// Builds a table over the vectors of a managed DLPack tensor without copying them. On
    /// success the table owns `managed` and calls its deleter exactly once when dropped; on
    /// failure the caller still owns it (the deleter is not called). The rows must have unit
    /// element stride; `keys` is read during the call only. With a quantized
    /// `options.storage`, the tensor is uint8 `[rows, row_bytes]` in that fused layout (what
    /// FBGEMM's and TorchRec's quantizers write); adopting never converts, so any other
    /// storage than the tensor's own is refused.
    ///
    /// # Safety
    /// `managed` must point to a valid managed tensor whose memory stays readable until its
    /// deleter runs, with a deleter callable once from any thread. `keys`, if given, must
    /// describe readable host memory as DLPack requires.
    pub unsafe fn adopt<M: ManagedTensorBase>(managed: *mut M, keys: Option<&DLTensor>, options: TableOptions) -> Result<Self> {
        options.gpu.check()?;
        // SAFETY: the caller guarantees managed points to a valid managed tensor; the reference
        // is only used before ownership moves into the store below.
        let m = unsafe { &*managed };
        // SAFETY: a valid managed tensor's DLTensor has shape and strides readable for ndim.
        let v = unsafe { TensorView::new(m.tensor(), "vectors") }?;
        let (format, rows, dim) = check_vectors(&v, options.storage)?;
        if options.storage.is_some_and(|f| f != format) {
            return Err(Error::invalid(
                "opts->storage",
                format!(
                    "{}, but vectors are {}; adopting keeps the caller's rows as they are (quantize or convert with strata_table_from_dlpack, which copies)",
                    options.storage.map_or("", |f| f.name()),
                    format.name()
                ),
            ));
        }
        v.require_non_negative_strides()?;
        let (rs, cs) = (v.strides[0] as usize, v.strides[1] as usize);
        let elems = format.float().map_or(format.row_bytes(dim), |_| dim);
        if rows > 0 && elems > 1 && cs != 1 {
            return Err(Error::layout(
                "vectors",
                format!("strides[1] = {cs}; adopting without a copy needs unit element stride (use strata_table_from_dlpack to copy)"),
            ));
        }
        if rows > 1 && rs < elems {
            let row = if format.is_quantized() { format!("a {} row's {elems} bytes", format.name()) } else { format!("dim = {dim}") };
            return Err(Error::layout("vectors", format!("strides[0] = {rs} is less than {row}; rows overlap")));
        }
        // SAFETY: the caller guarantees keys, if given, describes readable host memory.
        let index = unsafe { build_rows(keys, rows) }?;
        let default_row = vec![options.default_value; dim];
        // SAFETY: validated above. Ownership moves into the store only now, when nothing after
        // it can fail: on every error above the caller still owns `managed`.
        let owned = unsafe { dlpark::Managed::<M>::from_raw(managed) }.map_err(|e| Error::invalid("vectors", e.to_string()))?;
        // SAFETY: the view checked v.ptr is aligned for its dtype (format's) and that rows x
        // elems elements at row stride rs (unit element stride, rs >= elems when rows > 1; with
        // one row the stride is never used) lie in the address space; the caller guarantees the
        // memory stays readable until the deleter, which the store now owns, runs.
        let store = unsafe { Store::adopted(v.ptr, format, rows, dim, rs.max(elems) * v.elem, owned.into_deleter()) };
        Ok(StaticTable { store, rows: index, default_row, missing: options.missing, gpu: options.gpu })
    }

    /// Opens a table in HugeCTR's sparse format: `dir/key` (little-endian int64, one per row)
    /// and `dir/emb_vector` (float32, rows x `dim`, same order), no headers. The vectors are
    /// memory-mapped, not copied; the keys are read into the index and the key file is
    /// unmapped. The files must not be truncated while the table is open. With an
    /// `options.storage` other than float32 the rows are quantized (or converted) at load into
    /// the table's own memory instead, and the files are closed.
    pub fn open(dir: &Path, dim: i64, options: TableOptions) -> Result<Self> {
        options.gpu.check()?;
        let dim = usize::try_from(dim).map_err(|_| Error::invalid("dim", format!("{dim}; expected 1 <= dim <= {MAX_DIM}")))?;
        let folder = SparseFolder::open(dir, dim)?;
        let rows = folder.rows;
        let index = KeyIndex::build((0..rows).map(|r| folder.key(r)), |k| k as i64 as i128, "dir/key")?;
        if let Some(format) = options.storage.filter(|&f| f != RowFormat::Float(FloatDtype::F32)) {
            if let Some(m) = format.check_dim(dim) {
                return Err(Error::invalid("dim", m));
            }
            let store = match folder.into_vectors() {
                Some(m) => quantized_store(format, rows, dim, |r, row| {
                    for (c, x) in row.iter_mut().enumerate() {
                        let at = (r * dim + c) * 4;
                        *x = f32::from_le_bytes(m[at..at + 4].try_into().expect("4 bytes"));
                    }
                })?,
                None => Store::alloc(format, 0, dim, |_| Ok(()))?,
            };
            return StaticTable::assemble(store, Rows::Keyed(index), options);
        }
        let store = match folder.into_vectors() {
            Some(m) => {
                #[cfg(unix)]
                let _ = m.advise(memmap2::Advice::Random);
                Store::mapped(m, rows, dim)
            }
            None => Store::alloc(FloatDtype::F32, 0, dim, |_| Ok(()))?,
        };
        StaticTable::assemble(store, Rows::Keyed(index), options)
    }

    /// Elements per row.
    pub fn dim(&self) -> usize {
        self.store.dim()
    }

    /// Number of rows (keys).
    pub fn len(&self) -> usize {
        self.store.rows()
    }

    /// Whether the table has no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The float dtype of the stored vectors (see [`Store::dtype`]: float tables only).
    pub fn dtype(&self) -> FloatDtype {
        self.store.dtype()
    }

    /// How the rows are stored.
    pub fn format(&self) -> RowFormat {
        self.store.format()
    }

    /// Whether keys are arbitrary (hash index) rather than row numbers.
    pub fn is_keyed(&self) -> bool {
        matches!(self.rows, Rows::Keyed(_))
    }

    /// Bytes the keyed index takes (0 for dense tables).
    pub fn index_bytes(&self) -> usize {
        match &self.rows {
            Rows::Dense => 0,
            Rows::Keyed(ix) => ix.bytes(),
        }
    }

    /// Every (key, float32 row) in row order (the order of a HugeCTR folder's files). Keyed
    /// float32 tables only (what `strata_table_open` builds); others yield nothing.
    pub fn rows_in_file_order(&self) -> impl Iterator<Item = (u64, &[f32])> + '_ {
        let mut pairs: Vec<(usize, u64)> = match (&self.rows, self.store.format()) {
            (Rows::Keyed(ix), RowFormat::Float(FloatDtype::F32)) => ix.iter().map(|(k, r)| (r, k)).collect(),
            _ => Vec::new(),
        };
        pairs.sort_unstable();
        let dim = self.dim();
        pairs.into_iter().map(move |(r, k)| {
            // SAFETY: r < rows; the store holds dim aligned f32 values per row.
            (k, unsafe { std::slice::from_raw_parts(self.store.row_ptr(r) as *const f32, dim) })
        })
    }

    /// The vector store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The default row (`dim` float32 values), as bytes.
    pub(crate) fn default_row_ptr(&self) -> *const u8 {
        self.default_row.as_ptr() as *const u8
    }

    /// The default row.
    pub(crate) fn default_row(&self) -> &[f32] {
        &self.default_row
    }

    /// Resolves canonical `keys` on the host: float32 rows into `rows` (`keys.len() * dim`)
    /// and whether each was found into `found`. Missing keys' rows are left as they are.
    pub(crate) fn resolve(&self, keys: &[u64], rows: &mut [f32], found: &mut [bool]) {
        let dim = self.dim();
        let format = self.format();
        for (j, &key) in keys.iter().enumerate() {
            let r = match &self.rows {
                Rows::Dense => (key < self.len() as u64).then_some(key as usize),
                Rows::Keyed(ix) => ix.get(key),
            };
            found[j] = r.is_some();
            if let Some(r) = r {
                let src = self.store.row_ptr(r);
                for (c, v) in rows[j * dim..(j + 1) * dim].iter_mut().enumerate() {
                    // SAFETY: r < rows; the row holds dim values of the format.
                    *v = unsafe { crate::kernels::format::value(format, src, dim, c) };
                }
            }
        }
    }
}

/// Checks `keys` is a 1-D host tensor of integer keys (`expected` describes the shape wanted).
///
/// # Safety
/// `keys` must describe readable host memory as DLPack requires.
unsafe fn keys_1d(keys: &DLTensor, expected: &str) -> Result<(TensorView, KeyDtype)> {
    // SAFETY: the caller guarantees keys is a valid DLPack tensor: shape and strides readable.
    let k = unsafe { TensorView::new(keys, "keys") }?;
    require_host(k.device, "keys")?;
    let kd = KeyDtype::of(k.dtype, "keys")?;
    if k.shape.len() != 1 {
        return Err(Error::invalid("keys", format!("shape {:?}; expected {expected}", k.shape)));
    }
    Ok((k, kd))
}

/// The keys of a 1-D view from [`keys_1d`], in canonical 64-bit form.
fn canonical_keys(k: &TensorView, kd: KeyDtype) -> impl ExactSizeIterator<Item = u64> + '_ {
    let stride = if k.numel > 1 { k.strides[0] } else { 0 };
    // SAFETY: the view validated that every key is addressable.
    (0..k.numel).map(move |i| unsafe { kd.read(k.at(i as isize * stride)) })
}

/// Reads a 1-D host tensor of integer keys into canonical 64-bit form.
pub(crate) fn read_keys(keys: Vouched) -> Result<Vec<u64>> {
    // SAFETY: keys_1d needs readable host memory, which a Vouched tensor is (keys_1d refuses
    // other devices).
    let (k, kd) = unsafe { keys_1d(keys.get(), "a 1-D tensor of keys") }?;
    Ok(canonical_keys(&k, kd).collect())
}

/// Reads `[n, dim]` host float vectors as float32 rows.
pub(crate) fn read_rows(vectors: Vouched, n: usize, dim: usize) -> Result<Vec<f32>> {
    // SAFETY: a Vouched tensor is a valid DLPack tensor: shape and strides readable.
    let v = unsafe { TensorView::new(vectors.get(), "vectors") }?;
    require_host(v.device, "vectors")?;
    let dtype = FloatDtype::of(v.dtype, "vectors")?;
    if v.shape != [n, dim] {
        return Err(Error::invalid("vectors", format!("shape {:?}; expected [{n}, {dim}] (one row of the table's dim per key)", v.shape)));
    }
    let mut rows = Vec::with_capacity(n * dim);
    for r in 0..n {
        for c in 0..dim {
            let p = v.at(r as isize * v.strides[0] + c as isize * v.strides[1]);
            // SAFETY: the view validated every element (host memory, readable: Vouched); p is
            // aligned for dtype.
            rows.push(unsafe { dtype.load_f32(p) });
        }
    }
    Ok(rows)
}

/// Checks `vectors` is a host [rows, dim >= 1] float tensor, or, where `storage` is a
/// quantized format, a uint8 [rows, row_bytes] tensor of rows in that layout; returns the
/// format the tensor holds, its rows and their values (`dim`). Checks `dim` against `storage`.
fn check_vectors(v: &TensorView, storage: Option<RowFormat>) -> Result<(RowFormat, usize, usize)> {
    require_host(v.device, "vectors")?;
    if v.shape.len() != 2 {
        return Err(Error::invalid("vectors", format!("ndim = {}; expected 2 ([rows, dim])", v.shape.len())));
    }
    let (rows, cols) = (v.shape[0], v.shape[1]);
    let quantized = storage.filter(|f| f.is_quantized());
    let is_u8 = (v.dtype.code, v.dtype.bits, v.dtype.lanes) == (dlpark::ffi::DLDataTypeCode::UINT, 8, 1);
    let (format, dim) = match quantized {
        Some(f) if is_u8 => {
            // A fused row: the values' bytes, then scale and bias (8 bytes for int8, 4 for int4),
            // or fp8's scale (4 bytes).
            let (extra, per_byte) = match f {
                RowFormat::Int8 => (8, 1),
                RowFormat::Int4 => (4, 2),
                _ => (4, 1),
            };
            if cols <= extra {
                return Err(Error::invalid(
                    "vectors",
                    format!("shape[1] = {cols}; a fused {} row is its values' bytes then {extra} bytes of scale (and bias)", f.name()),
                ));
            }
            (f, (cols - extra) * per_byte)
        }
        _ => {
            let dtype = FloatDtype::of(v.dtype, "vectors").map_err(|e| match quantized {
                Some(f) => Error::Dtype {
                    arg: "vectors",
                    got: crate::dlpack::dtype_name(v.dtype),
                    expected: match f {
                        RowFormat::Int8 => "float32, float16 or bfloat16 (quantized at build), or uint8 rows in the fused int8 layout",
                        RowFormat::Int4 => "float32, float16 or bfloat16 (quantized at build), or uint8 rows in the fused int4 layout",
                        _ => "float32, float16 or bfloat16 (quantized at build), or uint8 rows in the fp8 layout (e4m3fn values, float32 scale)",
                    },
                },
                None => e,
            })?;
            (RowFormat::Float(dtype), cols)
        }
    };
    if dim == 0 || dim > MAX_DIM {
        let got = if format.is_quantized() { format!("shape[1] = {cols} ({} values a row)", dim) } else { format!("shape[1] = {cols}") };
        return Err(Error::invalid("vectors", format!("{got}; expected 1 <= dim <= {MAX_DIM}")));
    }
    if let Some(m) = storage.and_then(|f| f.check_dim(dim)) {
        return Err(Error::invalid("vectors", m));
    }
    Ok((format, rows, dim))
}

/// A store of `rows` rows of `dim` values as `format`, row `r` read as float32 by `row(r, buf)`
/// then quantized (or converted); a value that cannot be stored fails the build, naming its
/// row of `vectors`.
fn quantized_store(format: RowFormat, rows: usize, dim: usize, row: impl FnMut(usize, &mut [f32])) -> Result<Store> {
    quantized_store_named(format, rows, dim, row, |r, m| Error::invalid("vectors", format!("row {r}: {m}")))
}

/// [`quantized_store`] for rows that come from elsewhere than `vectors`: a value that cannot be
/// stored fails the build with `failed(r, why)`.
pub(crate) fn quantized_store_named(
    format: RowFormat,
    rows: usize,
    dim: usize,
    mut row: impl FnMut(usize, &mut [f32]),
    failed: impl Fn(usize, String) -> Error,
) -> Result<Store> {
    let rb = format.row_bytes(dim);
    let mut tmp = vec![0f32; dim];
    Store::alloc(format, rows, dim, |buf| {
        for (r, dst) in buf.chunks_exact_mut(rb).enumerate() {
            row(r, &mut tmp);
            quantize_row(format, &tmp, dst).map_err(|m| failed(r, m))?;
        }
        Ok(())
    })
}

/// Builds the row mapping: dense when `keys` is `None`, else an index over the 1-D `keys`.
///
/// # Safety
/// `keys`, if given, must describe readable host memory as DLPack requires.
unsafe fn build_rows(keys: Option<&DLTensor>, rows: usize) -> Result<Rows> {
    let Some(keys) = keys else { return Ok(Rows::Dense) };
    // SAFETY: keys_1d needs what our caller guarantees: keys is readable host memory.
    let (k, kd) = unsafe { keys_1d(keys, &format!("[{rows}] (one key per row of vectors)")) }?;
    if k.numel != rows {
        return Err(Error::invalid("keys", format!("shape {:?}; expected [{rows}] (one key per row of vectors)", k.shape)));
    }
    Ok(Rows::Keyed(KeyIndex::build(canonical_keys(&k, kd), |c| kd.value(c), "keys")?))
}

/// A summary of a table, for hosts and reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableInfo {
    /// Number of rows.
    pub rows: i64,
    /// Elements per row.
    pub dim: i64,
    /// How the rows are stored (a float dtype or a quantized layout).
    pub format: RowFormat,
    /// Whether keys are arbitrary 64-bit values (hash index) rather than row numbers.
    pub keyed: bool,
    /// Whether the vectors are a memory-mapped file (`strata_table_open`).
    pub mapped: bool,
    /// Whether the vectors are an adopted caller tensor.
    pub adopted: bool,
    /// Bytes of the keyed index (0 for dense tables and server tables, whose volatile tier
    /// is counted by `strata_table_get_stats`).
    pub index_bytes: u64,
    /// Bytes of the vectors (rows times a row's bytes in its format).
    pub vector_bytes: u64,
}

impl StaticTable {
    /// A summary of the table.
    pub fn info(&self) -> TableInfo {
        TableInfo {
            rows: self.len() as i64,
            dim: self.dim() as i64,
            format: self.format(),
            keyed: self.is_keyed(),
            mapped: self.store.is_mapped(),
            adopted: self.store.is_adopted(),
            index_bytes: self.index_bytes() as u64,
            vector_bytes: self.store.vector_bytes() as u64,
        }
    }
}
