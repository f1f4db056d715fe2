//! stickyvol's admin API (`proto/admin.proto`): the service the driver serves on a socket of its
//! own (`server::admin_listener`, never the CSI socket), and the `stickyvol volumes` /
//! `stickyvol volume …` commands that are its clients. The driver stays the only writer of its
//! records; the commands only ask it, as root (`access`).

pub mod access;
pub mod cli;
pub mod client;
pub mod progress;
pub mod render;
pub mod service;
pub mod stream;
