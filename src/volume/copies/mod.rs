//! Volume data copied: snapshots (`snapshot`, their copies run by `snapshot_jobs`), group
//! snapshots cut at one instant (`group`, the cut in `group_cut`), new
//! volumes filled from a snapshot or another volume (`content`), export and import streams
//! (`transfer`), a volume of a dead node's disk taken in (`adopt`), all through `cow`, which copies as cheaply as the pool allows; `in_flight`
//! counts the running copies no record shows, for the metrics. Uses `state` and `space`; its
//! operations are methods of `Volumes`, so it also uses `Volumes` and its operation `guard`
//! from the level above.

pub mod adopt;
pub mod content;
pub mod cow;
pub mod group;
pub mod group_cut;
pub mod in_flight;
pub mod snapshot;
pub mod snapshot_jobs;
pub mod transfer;
