//! What a node plugin runs against the Kubernetes API, beside the CSI services: the overflow
//! check (`overflow`), the Events on claims of volumes a full pool starves (`pool_full`), the
//! periodic project-id audit and its Events (`project_audit`), node loss' node side
//! (`nodeloss`), node-to-node transfers (`transfer`) the changes of IO limits the controller
//! hands over (`modify`), and IO limits kept on pods' new containers under cgroup v1
//! (`io_limits`). The host is reached only through
//! `crate::volume`.

pub mod io_limits;
pub mod modify;
pub mod nodeloss;
pub mod overflow;
pub mod pool_full;
pub mod project_audit;
pub mod transfer;
