//! The cluster wing: everything that talks to the Kubernetes API.
//! - `controller`: the loops of `--mode=controller` (restore placement, the class check, node
//!   loss' reconciler, overflow evictions, moves);
//! - `node`: the loops a node plugin runs against the API (the overflow check, the audit's
//!   Events, node loss' node side);
//! - `kit`: what both share (object types, the Event recorder, the client, Kubernetes' names,
//!   the unit tests' fake API server);
//! - `loops`: the one list of background loops, started and stopped in one place;
//! - `command`: `stickyvol cluster …`; `orphans` (`cluster orphans`) reads what both sides
//!   write, `moving` (`cluster move`) asks the controller's moves and follows one, `draining`
//!   (`cluster drain`) plans and asks the moves of a drained node's claims.
//!
//! Arrows: `loops`, `orphans`, `moving` and `draining` use both sides; `controller` and `node`
//! use `kit` and never each other; `kit` uses nothing else of `cluster`.

pub mod command;
pub mod controller;
pub mod draining;
pub mod kit;
pub mod loops;
pub mod moving;
pub mod node;
pub mod orphans;
