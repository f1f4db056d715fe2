//! Compiles the CSI schema (proto/csi.proto) and our admin API (proto/admin.proto) into Rust with
//! protox (pure Rust, no system protoc) and tonic-prost-build. The encoded descriptor set is also
//! written out so the server can offer gRPC reflection and name its methods in metrics.
//!
//! It also names the commit being built, for `stickyvol --version` and the build-info metric
//! (`STICKYVOL_REVISION` in the crate's environment): the variable STICKYVOL_REVISION when set
//! (the image build passes it: its build context has no .git), else what git says of this
//! source tree, else "unknown" (a tarball without .git, or no git installed).
//!
//! And it tells the linker of a release build which functions go first (link/hot-functions.txt),
//! so that the code a volume's cycle runs sits together (docs/performance.md, "The code a cycle
//! touches").

use std::path::{Path, PathBuf};
use std::{env, process::Command};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let revision = revision(&manifest_dir);
    println!("cargo:rustc-env=STICKYVOL_REVISION={revision}");
    link_hot_functions_first(&manifest_dir);
    println!("cargo:rerun-if-changed=proto/csi.proto");
    println!("cargo:rerun-if-changed=proto/admin.proto");
    let descriptors = protox::compile(["proto/csi.proto", "proto/admin.proto"], ["proto"])?;
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("descriptors.bin"),
        prost::Message::encode_to_vec(&descriptors),
    )?;
    tonic_prost_build::configure()
        .generate_default_stubs(true)
        // Stream chunks as `Bytes`: decoded as slices of the received buffer, not copied.
        .bytes(".stickyvol.admin.v1")
        .compile_fds(descriptors)?;
    Ok(())
}

/// The commit this tree is built from (see the module comment).
fn revision(manifest_dir: &Path) -> String {
    println!("cargo:rerun-if-env-changed=STICKYVOL_REVISION");
    if let Ok(given) = env::var("STICKYVOL_REVISION") {
        let given = given.trim();
        if !given.is_empty() {
            return given.to_string();
        }
    }
    from_git(manifest_dir).unwrap_or_else(|| "unknown".to_string())
}

/// git's word on the commit checked out in `manifest_dir`, and the files to watch so that the
/// next commit or checkout runs this script again. None unless this directory is the top of a
/// work tree: a tarball unpacked inside some other repository must not take that one's commit.
fn from_git(manifest_dir: &Path) -> Option<String> {
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git")
            .arg("-C")
            .arg(manifest_dir)
            .args(args)
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        Some(String::from_utf8(out.stdout).ok()?.trim().to_string())
    };
    let top = PathBuf::from(git(&["rev-parse", "--show-toplevel"])?);
    if top.canonicalize().ok()? != manifest_dir.canonicalize().ok()? {
        return None;
    }
    let commit = git(&["rev-parse", "--verify", "HEAD"])?;
    // HEAD names the branch; the branch's file (or packed-refs) moves with each commit. Only
    // files that exist are watched: cargo runs the script every time for one that does not.
    let mut watch = vec!["HEAD".to_string(), "packed-refs".to_string()];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch.push(branch);
    }
    for name in watch {
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", &name])
            && Path::new(&path).exists()
        {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    Some(commit)
}

/// A release build of the driver for x86_64 Linux, linked by lld (rustc's default linker there
/// since 1.90), gets lld's --symbol-ordering-file: the functions the list names go first in the
/// code, in its order, so the few MiB a cycle runs are contiguous. The kernel maps a file's pages
/// 64 KiB around each one a fault touches, so scattered code costs resident memory far beyond its
/// size. Names the binary no longer has are skipped without a warning: a stale list costs memory,
/// not a build (the speed guard says when it is stale). And relative relocations packed (DT_RELR,
/// glibc 2.36 and later, as in the image): 0.8 MiB the loader otherwise reads at every start.
/// `STICKYVOL_LINK_HOT_FIRST=0` leaves the linker alone (a linker other than lld or mold).
fn link_hot_functions_first(manifest_dir: &Path) {
    let list = manifest_dir.join("link/hot-functions.txt");
    println!("cargo:rerun-if-changed={}", list.display());
    println!("cargo:rerun-if-env-changed=STICKYVOL_LINK_HOT_FIRST");
    let release = env::var("PROFILE").is_ok_and(|profile| profile == "release");
    let target = env::var("TARGET").is_ok_and(|target| target == "x86_64-unknown-linux-gnu");
    let wanted = env::var("STICKYVOL_LINK_HOT_FIRST").map_or(true, |value| value != "0");
    if !(release && target && wanted && list.exists() && linker_is_rustcs_lld()) {
        return;
    }
    for arg in [
        format!("--symbol-ordering-file={}", list.display()),
        "--no-warn-symbol-ordering".to_string(),
        "-z,pack-relative-relocs".to_string(),
    ] {
        println!("cargo:rustc-link-arg-bin=stickyvol=-Wl,{arg}");
    }
}

/// Whether the link is rustc's own lld: a rustc of 1.90 or later, and no flag of the build's
/// choosing a linker (GNU ld, an older rustc's default, does not know the options above).
fn linker_is_rustcs_lld() -> bool {
    let flags = env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    if flags.contains("linker") || flags.contains("fuse-ld") {
        return false;
    }
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".to_string());
    let Ok(out) = Command::new(rustc).arg("-vV").output() else {
        return false;
    };
    let version = String::from_utf8_lossy(&out.stdout);
    let release = version
        .lines()
        .find_map(|line| line.strip_prefix("release: "));
    let minor = release.and_then(|release| release.split('.').nth(1)?.parse::<u32>().ok());
    let major = release.and_then(|release| release.split('.').next()?.parse::<u32>().ok());
    matches!((major, minor), (Some(1), Some(minor)) if minor >= 90)
}
