//! What we remember, durably: volume and snapshot ids, the records, and how a change to a
//! record becomes durable: one journal entry, flushed (`journal`, its file format in
//! `journal_file`), later written back to the record files (`records`, `<data-dir>/state/`).
//! `store` keeps the node's volume records indexed in memory over them; `format` says which
//! format a record needs, and refuses one this release cannot read. Uses nothing of the other
//! rooms.

mod files;
pub mod format;
pub mod id;
pub mod journal;
pub(crate) mod journal_file;
pub mod record;
pub mod records;
pub mod store;
