//! Node loss: what happens to claims pinned to a node that is gone (issue 23). `policy` is the
//! StorageClass parameter, `decide` the pure rules the reconciler applies.

pub mod decide;
pub mod policy;
