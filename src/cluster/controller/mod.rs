//! What runs only in `--mode=controller` (the StatefulSet), each a loop over watches of the
//! API: restore placement (`placement`), the check of our StorageClasses (`class_check`), node
//! loss' reconciler (`nodeloss`) and the evictions the nodes' overflow checks ask for
//! (`evictions`), and moves of claims to another node with their data (`moves`). Nothing here touches the host: it may use `volume`'s
//! ids, never `crate::host`.

pub mod class_check;
pub mod evictions;
pub mod moves;
pub mod nodeloss;
pub mod placement;
