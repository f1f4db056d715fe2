//! The export stream reader (`stickyvol volume import`'s input, untrusted: it may come from
//! another node or a user), run whole: `Importer` reads and checks the stream and builds what
//! it holds, a tree in a fresh empty directory or an image in a sparse file, on a tmpfs when
//! there is one. Beyond "never panics":
//! - memory: the heap the import holds at its peak is bounded by a constant (the buffers) plus
//!   a multiple of the bytes the stream really has, whatever its length fields claim;
//! - nothing lands outside the destination;
//! - a stream accepted was consumed to its last byte, and its counts fit in it.
#![no_main]

use std::alloc::{GlobalAlloc, Layout, System};
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use libfuzzer_sys::fuzz_target;
use stickyvol::host::archive::{Importer, Kind};

/// Counts the heap in use and its high-water mark (all threads: the hash runs on a helper).
struct Counting;

static IN_USE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            let now = IN_USE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            let now = IN_USE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            // Both blocks may exist during the move: count the larger, then settle.
            let now = IN_USE.fetch_add(new_size, Ordering::Relaxed) + new_size;
            PEAK.fetch_max(now, Ordering::Relaxed);
            IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// What any import holds whatever the stream: the 64 KiB input buffer, a little for the
/// hashing helper, the header and the error messages; everything else must be paid for by
/// bytes of the stream.
const FIXED_HEAP: usize = 256 << 10;
/// Heap a stream byte may justify (a payload buffer grown by doubling, names, paths).
const HEAP_PER_BYTE: usize = 8;

/// The largest image file made for a stream (sparse, so it costs nothing until written).
const IMAGE_MAX: u64 = 64 << 20;
/// The data a tree import may write.
const TREE_LIMIT: u64 = 1 << 20;

fn scratch() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let base = ["/dev/shm", "/tmp"]
            .into_iter()
            .map(PathBuf::from)
            .find(|dir| dir.is_dir())
            .unwrap_or_else(std::env::temp_dir);
        base.join(format!("stickyvol-fuzz-export-{}", std::process::id()))
    })
}

fn reset(dir: &Path) {
    if dir.exists() {
        fs::remove_dir_all(dir).unwrap();
    }
    fs::create_dir(dir).unwrap();
}

fuzz_target!(|data: &[u8]| {
    let scratch = scratch();
    reset(scratch);
    let dest = scratch.join("dest");
    let base = IN_USE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);

    let summary = Importer::start(data).and_then(|(importer, header)| match header.kind {
        Kind::Tree => {
            fs::create_dir(&dest).unwrap();
            importer.into_tree(&dest, TREE_LIMIT)
        }
        Kind::Image => {
            File::create(&dest)
                .unwrap()
                .set_len(header.size_bytes.min(IMAGE_MAX))
                .unwrap();
            importer.into_image(&dest)
        }
    });

    let peak = PEAK.load(Ordering::Relaxed) - base;
    let bound = FIXED_HEAP + HEAP_PER_BYTE * data.len();
    assert!(
        peak <= bound,
        "a stream of {} bytes made the import hold {peak} bytes of heap (bound {bound})",
        data.len()
    );
    let landed: Vec<_> = fs::read_dir(scratch)
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert!(
        landed.is_empty() || landed == ["dest"],
        "written beside the destination: {landed:?}"
    );
    if let Ok(summary) = summary {
        assert_eq!(summary.stream_bytes, data.len() as u64);
        assert!(summary.data_bytes <= data.len() as u64);
        assert!(summary.entries <= data.len() as u64);
    }
});
