//! # datacache
//!
//! A multi-level training-data cache (paper 001 §4.1, DataCache, Fig. 5): samples come from
//! a slow remote store on the first epoch, are kept raw on local disk and decoded in
//! memory, split across ranks, and read ahead of compute by background workers.
#![deny(missing_docs)]
