//! The channel a collective batch agrees on: one duplicate communicator per group of ranks that
//! distributed tables were built over, shared by every such table.
//!
//! A `strata_lookup_batch` that holds a distributed table agrees twice (after the checks, and at
//! the end). It agrees on its tables' channel rather than on one table's communicator, so that a
//! rank which cannot name the batch's tables (its request array is unreadable, or the request
//! that is distributed elsewhere has a NULL table here) can still take part: when the process has
//! one channel, that rank refuses the batch on it ([`refuse_batch`]) and the other ranks fail
//! with its error instead of waiting for it.
//!
//! Channels are made collectively, while a distributed table is built (every rank of its
//! communicator builds it, so every rank finds or makes the same channel), and are kept for the
//! life of the process: a channel dropped on one rank and kept on another would make the next
//! build collective on one and not the other. A channel is used by one collective call at a time
//! on a rank (under its mutex), from the thread that makes the call.

use super::comm::Comm;
use crate::error::{Error, Result};
use crate::util::lock::lock;
use std::sync::{Arc, Mutex};

/// A duplicate of a group's communicator, for the agreements of collective batches.
pub(crate) struct Channel {
    comm: Mutex<Comm>,
}

// SAFETY: the communicator is a process-wide MPI handle, used only under the mutex by the
// thread making a collective call.
unsafe impl Send for Channel {}
// SAFETY: as for Send: every use goes through the mutex.
unsafe impl Sync for Channel {}

/// Every channel this process has made, in the order they were made.
static CHANNELS: Mutex<Vec<Arc<Channel>>> = Mutex::new(Vec::new());

/// The channel of `comm`'s group: the one made for a congruent communicator before, or a new
/// one (then collective over `comm`, as the table build that asks for it is).
pub(crate) fn of(comm: &Comm) -> Arc<Channel> {
    let mut all = lock(&CHANNELS);
    if let Some(c) = all.iter().find(|c| lock(&c.comm).congruent(comm)) {
        return c.clone();
    }
    let c = Arc::new(Channel { comm: Mutex::new(comm.twin()) });
    all.push(c.clone());
    c
}

impl Channel {
    /// The verdict of every rank of the group on a step each ran locally (see [`Comm::agree`]).
    pub(crate) fn agree(&self, local: Result<()>) -> Result<()> {
        lock(&self.comm).agree(local)
    }
}

/// The error of a batch this rank refuses before it could find any of its tables: where the
/// process holds one channel (every distributed table built over one group of ranks, the usual
/// case), the batch is taken to be collective on it, and the other ranks, waiting in the batch's
/// first agreement, fail with this error. With no channel, or several (tables over different
/// groups: which one the batch was for cannot be known), the error is only this rank's.
pub(crate) fn refuse_batch(e: Error) -> Error {
    let only = {
        let all = lock(&CHANNELS);
        if all.len() == 1 { Some(all[0].clone()) } else { None }
    };
    match only {
        Some(c) => c.agree(Err(e)).err().unwrap_or_else(|| Error::Internal("agree dropped an error".into())),
        None => e,
    }
}
