//! [`InFlight`]: a count of strata's queued work that still refers to a table.

use crate::util::lock::lock;
use std::sync::{Condvar, Mutex};

/// Counts queued work that refers to a table; the table waits for zero before it is freed.
#[derive(Default)]
pub(crate) struct InFlight {
    n: Mutex<usize>,
    zero: Condvar,
}

impl InFlight {
    pub(crate) fn start(&self) {
        *lock(&self.n) += 1;
    }

    pub(crate) fn done(&self) {
        let mut n = lock(&self.n);
        *n -= 1;
        if *n == 0 {
            self.zero.notify_all();
        }
    }

    pub(crate) fn wait(&self) {
        let mut n = lock(&self.n);
        while *n != 0 {
            n = self.zero.wait(n).unwrap_or_else(|e| e.into_inner());
        }
    }
}
