//! What runs only in `--mode=controller` (the StatefulSet), each a loop over watches of the
//! API: restore placement (`placement`), the check of our StorageClasses (`class_check`) and
//! node loss' reconciler (`nodeloss`). Nothing here touches the host: it may use `volume`'s
//! ids, never `crate::host`.

pub mod class_check;
pub mod nodeloss;
pub mod placement;
