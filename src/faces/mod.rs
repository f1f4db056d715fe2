//! The CSI services kubelet and the sidecars call: thin faces that validate a request
//! (`request`), call the volume domain and map its errors to gRPC codes. `driver` is what the
//! three services share (the configuration and, where this instance works on the host, the
//! volumes). `controller` here is CSI's Controller service, which every node serves (the
//! provisioner runs beside it); what runs only in `--mode=controller` is `crate::cluster::controller`.

pub mod controller;
pub mod driver;
pub mod group_controller;
pub mod identity;
pub mod node;
pub mod request;
