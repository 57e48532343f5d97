//! strata's duplicate of the host's communicator, and the collective steps distributed tables
//! are made of: agreeing on success, all-gathers and all-to-all exchanges, timed.
//!
//! A [`Comm`] is used by one collective call at a time (its table serialises them); MPI is only
//! ever called from the thread that made that call.

use crate::error::{Error, ErrorKind, Result};
use crate::util::threads;
use mpi::datatype::{Equivalence, MutView, Partition, PartitionMut, UserDatatype, View};
use mpi::ffi;
use mpi::raw::FromRaw;
use mpi::topology::{Communicator, CommunicatorRelation, SimpleCommunicator};
use mpi::traits::*;
use std::time::{Duration, Instant};

/// A duplicate of a host communicator, freed (`MPI_Comm_free`) on drop, unless the host has
/// already finalised MPI (then it is left alone: MPI has released it). Never finalises MPI.
pub(crate) struct Comm {
    comm: std::mem::ManuallyDrop<SimpleCommunicator>,
    pub rank: usize,
    pub size: usize,
    /// Time spent in MPI calls since the last [`Comm::take_time`].
    spent: Duration,
}

impl Comm {
    /// Duplicates the communicator whose Fortran handle is `fint` (`MPI_Comm_c2f`, mpi4py's
    /// `comm.py2f()`). Collective over that communicator. Fails when MPI is not initialised (or
    /// already finalised), or when `fint` is not an intra-communicator.
    pub fn duplicate(fint: i32) -> Result<Comm> {
        let (mut init, mut fin) = (0, 0);
        // SAFETY: both may be called at any time, before MPI_Init and after MPI_Finalize.
        unsafe {
            ffi::MPI_Initialized(&mut init);
            ffi::MPI_Finalized(&mut fin);
        }
        if init == 0 || fin != 0 {
            let state = if init == 0 { "not initialised" } else { "already finalised" };
            return Err(Error::invalid(
                "comm",
                format!("MPI is {state}; call MPI_Init (or MPI_Init_thread) before making a distributed table"),
            ));
        }
        // SAFETY: MPI is initialised; f2c maps an unknown handle to MPI_COMM_NULL.
        let raw = unsafe { ffi::MPI_Comm_f2c(fint) };
        // Open MPI answers a NULL handle for an index it never issued; others MPI_COMM_NULL.
        // SAFETY: RSMPI_COMM_NULL is a constant the rsmpi C shim defines and never writes; an
        // all-zero MPI_Comm is a valid value of the handle type (a NULL pointer or 0).
        if raw == unsafe { ffi::RSMPI_COMM_NULL } || raw == unsafe { std::mem::zeroed() } {
            return Err(Error::invalid(
                "comm",
                format!("*comm = {fint} is not a communicator (MPI_Comm_f2c gives MPI_COMM_NULL); expected MPI_Comm_c2f of one"),
            ));
        }
        let mut inter = 0;
        // SAFETY: raw is a live communicator handle.
        unsafe { ffi::MPI_Comm_test_inter(raw, &mut inter) };
        if inter != 0 {
            return Err(Error::invalid("comm", "is an inter-communicator; expected an intra-communicator"));
        }
        // SAFETY: RSMPI_COMM_NULL is a constant the rsmpi C shim defines and never writes.
        let mut dup = unsafe { ffi::RSMPI_COMM_NULL };
        // SAFETY: raw is a live intra-communicator; the duplicate is ours to own and free.
        let rc = unsafe { ffi::MPI_Comm_dup(raw, &mut dup) };
        // SAFETY: reads the same never-written constant as above.
        if rc != 0 || dup == unsafe { ffi::RSMPI_COMM_NULL } {
            return Err(Error::Internal(format!("MPI_Comm_dup failed with error code {rc}")));
        }
        // SAFETY: dup is a fresh user intra-communicator, used only through this wrapper.
        let comm = unsafe { SimpleCommunicator::from_raw(dup) };
        let (rank, size) = (comm.rank() as usize, comm.size() as usize);
        Ok(Comm { comm: std::mem::ManuallyDrop::new(comm), rank, size, spent: Duration::ZERO })
    }

    /// A duplicate of this communicator (`MPI_Comm_dup`; collective over it), with its own
    /// context: collective steps on the two never match each other.
    pub fn twin(&self) -> Comm {
        let comm = self.comm.duplicate();
        Comm { comm: std::mem::ManuallyDrop::new(comm), rank: self.rank, size: self.size, spent: Duration::ZERO }
    }

    /// Whether `other` holds the same processes in the same order (`MPI_Comm_compare` answers
    /// identical or congruent: a duplicate of the same group). Local.
    pub fn congruent(&self, other: &Comm) -> bool {
        matches!(self.comm.compare(&*other.comm), CommunicatorRelation::Identical | CommunicatorRelation::Congruent)
    }

    fn timed<T>(&mut self, f: impl FnOnce(&SimpleCommunicator) -> T) -> T {
        let t = Instant::now();
        let r = f(&self.comm);
        self.spent += t.elapsed();
        r
    }

    /// Returns and resets the time spent in MPI calls.
    pub fn take_time(&mut self) -> Duration {
        std::mem::take(&mut self.spent)
    }

    /// Every rank's `mine`, in rank order.
    pub fn all_gather<T: Equivalence + Copy + Default>(&mut self, mine: &[T]) -> Vec<T> {
        let mut all = vec![T::default(); mine.len() * self.size];
        self.timed(|c| c.all_gather_into(mine, &mut all[..]));
        all
    }

    /// Sends `send[r]` to rank `r`; returns what every rank sent to this one.
    pub fn all_to_all<T: Equivalence + Copy + Default>(&mut self, send: &[T]) -> Vec<T> {
        let mut recv = vec![T::default(); send.len()];
        self.timed(|c| c.all_to_all_into(send, &mut recv[..]));
        recv
    }

    /// Sends items `displs(send_counts)[r] ..` (`send_counts[r]` of them) to rank `r`, where an
    /// item is `width` consecutive values, and receives `recv_counts[r]` items from each rank `r`
    /// into `recv` (exactly `sum(recv_counts) * width` values), placed in rank order.
    pub fn exchange<T: Equivalence + Copy + Default>(
        &mut self,
        send: &[T],
        send_counts: &[i32],
        recv_counts: &[i32],
        width: usize,
        recv: &mut [T],
    ) {
        let total: usize = recv_counts.iter().map(|&c| c as usize).sum();
        let sent_items: usize = send_counts.iter().map(|&c| c as usize).sum();
        assert!(recv.len() == total * width && send.len() >= sent_items * width, "exchange buffers sized by the caller");
        // An empty slice's pointer is dangling, and for bytes it equals MPI_IN_PLACE ((void *)1):
        // pass a real one-element buffer instead (nothing is read or written through it).
        let (dummy_send, mut dummy_recv) = ([T::default()], [T::default()]);
        let send = if send.is_empty() { &dummy_send[..] } else { send };
        let recv = if recv.is_empty() { &mut dummy_recv[..] } else { recv };
        let (sd, rd) = (displs(send_counts), displs(recv_counts));
        let item = UserDatatype::contiguous(width as i32, &T::equivalent_datatype());
        self.timed(|c| {
            // SAFETY: `send` holds at least sent_items * width values and `recv` total * width
            // (both checked above), each viewed as items of `width` values.
            let sv = unsafe { View::with_count_and_datatype(send, sent_items as i32, &item) };
            // SAFETY: as for sv.
            let mut rv = unsafe { MutView::with_count_and_datatype(recv, total as i32, &item) };
            c.all_to_all_varcount_into(&Partition::new(&sv, send_counts, &sd[..]), &mut PartitionMut::new(&mut rv, recv_counts, &rd[..]));
        });
    }

    /// The collective verdict on a step every rank ran: every rank gets `Ok` when every rank
    /// succeeded; else a rank that failed gets its own error, and the others an error with the
    /// status and message of the lowest failing rank. One all-gather of the status, plus one of
    /// the messages when something failed.
    pub fn agree<T>(&mut self, local: Result<T>) -> Result<T> {
        let code = match &local {
            Ok(_) => 0i32,
            Err(e) => e.kind().code(),
        };
        let codes = self.all_gather(&[code]);
        self.settle(local, &codes)
    }

    /// [`Comm::agree`] once every rank's status code is known (`codes[r]`, 0 for success).
    pub fn settle<T>(&mut self, local: Result<T>, codes: &[i32]) -> Result<T> {
        let Some(first) = codes.iter().position(|&c| c != 0) else { return local };
        let msg = match &local {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        };
        let messages = self.all_gather_bytes(msg.as_bytes());
        match local {
            Err(e) => Err(e),
            Ok(_) => Err(Error::Remote {
                rank: first as i32,
                kind: ErrorKind::from_code(codes[first]).unwrap_or(ErrorKind::Internal),
                msg: String::from_utf8_lossy(&messages[first]).into_owned(),
            }),
        }
    }

    /// The default thread count of a lookup on this rank: the CPUs of its affinity mask, each
    /// shared equally among the ranks on this node whose masks hold it (ranks found with
    /// `MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`), or `STRATA_NUM_THREADS` when set. Two
    /// ranks bound to a core each get 1; four unbound ranks on 16 cores get 4. Collective.
    pub fn node_threads(&mut self) -> usize {
        /// Words of a mask as exchanged (1024 CPUs, the size of a Linux `cpu_set_t`).
        const WORDS: usize = 16;
        let mut mine = threads::process_mask();
        mine.resize(WORDS, 0);
        let node = self.timed(|c| c.split_shared(c.rank()));
        let mut all = vec![0u64; WORDS * node.size() as usize];
        self.timed(|_| node.all_gather_into(&mine[..], &mut all[..]));
        let masks: Vec<Vec<u64>> = all.chunks(WORDS).map(<[u64]>::to_vec).collect();
        threads::shared_threads(&mine, &masks)
    }

    /// Every rank's byte string, in rank order.
    fn all_gather_bytes(&mut self, mine: &[u8]) -> Vec<Vec<u8>> {
        let lens = self.all_gather(&[mine.len() as i32]);
        let d = displs(&lens);
        let mut all = vec![0u8; lens.iter().map(|&l| l as usize).sum()];
        self.timed(|c| c.all_gather_varcount_into(mine, &mut PartitionMut::new(&mut all[..], &lens[..], &d[..])));
        d.iter().zip(&lens).map(|(&s, &l)| all[s as usize..(s + l) as usize].to_vec()).collect()
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        let mut fin = 0;
        // SAFETY: callable at any time.
        unsafe { ffi::MPI_Finalized(&mut fin) };
        if fin == 0 {
            // SAFETY: dropped once, here; frees our duplicate (MPI_Comm_free).
            unsafe { std::mem::ManuallyDrop::drop(&mut self.comm) };
        }
    }
}

/// Makes `v` hold `n` values, reusing its memory and keeping (not zeroing) those it has: for
/// buffers every element of which is written before it is read.
pub(crate) fn size<T: Copy + Default>(v: &mut Vec<T>, n: usize) {
    v.truncate(n);
    v.resize(n, T::default());
}

/// Exclusive prefix sums of `counts`.
pub(crate) fn displs(counts: &[i32]) -> Vec<i32> {
    counts
        .iter()
        .scan(0i32, |acc, &c| {
            let d = *acc;
            *acc += c;
            Some(d)
        })
        .collect()
}
