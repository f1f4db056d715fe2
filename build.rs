//! Compiles the CSI schema (proto/csi.proto) and our admin API (proto/admin.proto) into Rust with
//! protox (pure Rust, no system protoc) and tonic-prost-build. The encoded descriptor set is also
//! written out so the server can offer gRPC reflection and name its methods in metrics.
//!
//! It also names the commit being built, for `stickyvol --version` and the build-info metric
//! (`STICKYVOL_REVISION` in the crate's environment): the variable STICKYVOL_REVISION when set
//! (the image build passes it: its build context has no .git), else what git says of this
//! source tree, else "unknown" (a tarball without .git, or no git installed).

use std::path::{Path, PathBuf};
use std::{env, process::Command};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let revision = revision(&manifest_dir);
    println!("cargo:rustc-env=STICKYVOL_REVISION={revision}");
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
