//! The C ABI of `include/strata.h`, and the only place C types live.
//!
//! - [`types`]: every `#[repr(C)]` struct and enum of the header, and its conversion into the
//!   core's Rust types, but for the `__partitioned__` structs, in [`partition_types`];
//!   [`sized`]: the `struct_size` rules, in one place;
//! - [`boundary`]: the panic boundary every export runs in, the thread's last error, and the
//!   pointer-check helpers; [`tensor`]: DLPack version and flag checks of managed tensors;
//! - the exports, by what they act on: [`library`] (versions, features, errors), [`table`]
//!   (the `strata_table` handle and its constructors), [`lookup`], [`server`] (the
//!   `strata_server` handle and table updates), [`partition`].
//!
//! An export checks its arguments, makes one call into the core, and returns a status: no
//! lookup, table or server logic lives here.

#![allow(non_camel_case_types)]

mod boundary;
mod handle;
mod library;
mod lookup;
mod partition;
mod partition_types;
mod server;
mod sized;
mod status;
mod table;
mod tensor;
mod types;

pub use library::*;
pub use lookup::*;
pub use partition::*;
pub use partition_types::*;
pub use server::*;
pub use status::Status;
pub use table::*;
pub use types::*;
