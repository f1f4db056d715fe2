//! Capabilities of the calling thread. The tests run as root, and root's CAP_SYS_RESOURCE lets
//! writes past a VFS quota limit (ext4: the generic quota code ignores hard limits for it; XFS
//! enforces project limits even then). A pod's container has no CAP_SYS_RESOURCE unless it is
//! privileged, so a test of what a pod sees writes without it.
//!
//! capget/capset act on one thread (pid 0 = the caller), so other test threads keep theirs.

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
const CAP_SYS_RESOURCE: u32 = 24;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

fn get() -> [CapData; 2] {
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget fills two CapData (version 3) and reads the header; both outlive the call.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &raw mut header, data.as_mut_ptr()) };
    assert_eq!(rc, 0, "capget: {}", std::io::Error::last_os_error());
    data
}

fn set(data: &[CapData; 2]) {
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    // SAFETY: capset reads the header and two CapData, which outlive the call.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &raw mut header, data.as_ptr()) };
    assert_eq!(rc, 0, "capset: {}", std::io::Error::last_os_error());
}

/// Whether the calling thread has CAP_SYS_RESOURCE in its effective set.
pub fn has_sys_resource() -> bool {
    get()[0].effective & (1 << CAP_SYS_RESOURCE) != 0
}

/// Runs `f` on this thread with CAP_SYS_RESOURCE out of its effective set (it stays permitted
/// and is raised again afterwards, also when `f` panics), as a pod's container runs.
pub fn without_sys_resource<T>(f: impl FnOnce() -> T) -> T {
    struct Restore([CapData; 2]);
    impl Drop for Restore {
        fn drop(&mut self) {
            set(&self.0);
        }
    }
    let before = get();
    let restore = Restore(before);
    let mut lowered = before;
    lowered[0].effective &= !(1 << CAP_SYS_RESOURCE);
    set(&lowered);
    assert!(!has_sys_resource());
    let result = f();
    drop(restore);
    result
}
