//! What runs only in `--mode=controller` (the StatefulSet), each a loop over watches of the
//! API: restore placement (`placement`), the check of our StorageClasses (`class_check`), node
//! loss' reconciler (`nodeloss`) and the evictions the nodes' overflow checks ask for
//! (`evictions`), moves of claims to another node with their data (`moves`), and the
//! hand-over of ControllerModifyVolume to the volume's node (`modify`). Nothing here touches the host: it may use `volume`'s
//! ids, never `crate::host`.

pub mod class_check;
pub mod evictions;
pub mod modify;
pub mod moves;
pub mod nodeloss;
pub mod placement;
