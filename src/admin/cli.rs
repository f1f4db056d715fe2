//! `stickyvol volumes` and `stickyvol volume show|delete|export|import`: the admin API's
//! commands. They only ask the driver serving on this node's admin socket; it stays the only
//! writer of its records. Output on stdout is deterministic (tables, JSON, the export stream); notes,
//! progress and errors go to stderr. Exit codes: 0 done, 1 failed, 2 refused (bad flags, a
//! terminal where a stream belongs).

use std::cell::RefCell;
use std::fs::File;
use std::io::{self, IsTerminal, Seek, Write};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::client::{Admin, AdminError, DESCRIBE_DEADLINE};
use super::progress::Meter;
use super::render;
use crate::config::DEFAULT_ADMIN_SOCKET;

/// The admin commands, as `main` flattens them into its own subcommands.
#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// List the volumes of this node, as the driver serving here knows them.
    ///
    /// One row per volume: its id, claim, pool, type (fs or block), size, bytes used (- for a
    /// plain directory unless --measure walks it), how its size is enforced, its condition, how many pod
    /// publications and snapshots it has, and where its data lives. Talks to the driver's
    /// admin API on its admin socket (root only).
    Volumes(VolumesArgs),
    /// Show, delete, export or import one volume of this node.
    Volume(VolumeArgs),
}

/// Where the driver serves the admin API: the same flag, environment variable and default as
/// `stickyvol serve --admin-socket`.
#[derive(Debug, Clone, Args)]
pub struct AdminSocket {
    /// The driver's admin socket (not its CSI socket, which does not serve the admin API).
    #[arg(
        long = "admin-socket",
        env = "ADMIN_SOCKET",
        value_name = "PATH",
        default_value = DEFAULT_ADMIN_SOCKET,
        global = true
    )]
    pub path: PathBuf,
}

#[derive(Debug, Args)]
pub struct VolumesArgs {
    #[command(flatten)]
    pub socket: AdminSocket,

    /// Print a JSON array of volumes (keys are admin.proto's field names) instead of a table.
    #[arg(long)]
    pub json: bool,

    /// Only the volumes of this pool.
    #[arg(long, value_name = "POOL")]
    pub pool: Option<String>,

    /// Measure what plain-directory volumes use by walking them (slow on big trees); without
    /// it their USED is `-`. Quota-limited and block volumes are always measured.
    #[arg(long)]
    pub measure: bool,
}

#[derive(Debug, Args)]
pub struct VolumeArgs {
    #[command(flatten)]
    pub socket: AdminSocket,

    #[command(subcommand)]
    pub command: VolumeCommand,
}

#[derive(Debug, Subcommand)]
pub enum VolumeCommand {
    /// Everything the driver knows about one volume.
    Show {
        /// The volume id (sv-…).
        #[arg(value_name = "ID")]
        volume_id: String,
        /// Print the volume as a JSON object (one element of `volumes --json`).
        #[arg(long)]
        json: bool,
    },
    /// Delete a volume and its data, as CSI DeleteVolume would; refused while it is published.
    ///
    /// Use it for volumes whose PV is gone (e.g. a Retain policy, or a lost API object); a
    /// volume that still has a PV is better deleted through Kubernetes.
    Delete {
        /// The volume id (sv-…).
        #[arg(value_name = "ID")]
        volume_id: String,
    },
    /// Lift a directory volume's read-only fence, giving its pods a fresh grace to free space
    /// or make their tree measurable before the check that fenced it looks again.
    Unfence {
        /// The volume id (sv-…).
        #[arg(value_name = "ID")]
        volume_id: String,
    },
    /// Fill this node's unpublished volume with the data of a volume on another node, straight
    /// from that node's plugin (replacing what it holds). The source's PV must be annotated
    /// stickyvol.csi.io/move-to=<this node>.
    ///
    /// With --from-disk, the source node is dead and its disk is attached here, its pool
    /// mounted at <data-dir>/adopt/<DISK>: the volume's data is read from there instead.
    Pull {
        /// This node's volume id (sv-…), the copy's target.
        #[arg(value_name = "ID")]
        volume_id: String,
        /// The source volume's PV name.
        #[arg(long = "from", value_name = "PV")]
        source_pv: String,
        /// The name under <data-dir>/adopt/ where the source node's disk (its pool) is mounted.
        #[arg(long = "from-disk", value_name = "DISK")]
        from_disk: Option<String>,
    },
    /// Write the volume's content to stdout as an export stream.
    ///
    /// An unpublished volume is read directly (and held for the export); a published one from
    /// a temporary snapshot. Pipe it into `stickyvol volume import` on another node, or
    /// redirect it to a file; a terminal is refused.
    Export {
        /// The volume id (sv-…).
        #[arg(value_name = "ID")]
        volume_id: String,
        /// No note and no progress meter on stderr.
        #[arg(long, short)]
        quiet: bool,
    },
    /// Fill an existing, unpublished volume from an export stream on stdin.
    ///
    /// The driver answers once the stream's checksum matched and the data is on disk.
    Import {
        /// The volume id (sv-…).
        #[arg(value_name = "ID")]
        volume_id: String,
        /// Discard the volume's present content (without it, a volume that is not empty is
        /// refused).
        #[arg(long)]
        replace: bool,
        /// No summary and no progress meter on stderr.
        #[arg(long, short)]
        quiet: bool,
    },
}

/// Why a command stopped: the message (without the command's name) and the exit code.
#[derive(Debug)]
struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    /// Refused before doing anything (exit 2).
    fn refused(message: impl Into<String>) -> Failure {
        Failure {
            code: 2,
            message: message.into(),
        }
    }
}

impl From<AdminError> for Failure {
    fn from(err: AdminError) -> Failure {
        Failure {
            code: 1,
            message: err.to_string(),
        }
    }
}

/// Runs one admin command; errors are printed as `stickyvol volume delete: …`.
pub fn run(command: AdminCommand) -> ExitCode {
    let name = command_name(&command);
    match dispatch(command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("{name}: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}

fn command_name(command: &AdminCommand) -> &'static str {
    match command {
        AdminCommand::Volumes(_) => "stickyvol volumes",
        AdminCommand::Volume(args) => match args.command {
            VolumeCommand::Show { .. } => "stickyvol volume show",
            VolumeCommand::Delete { .. } => "stickyvol volume delete",
            VolumeCommand::Unfence { .. } => "stickyvol volume unfence",
            VolumeCommand::Pull { .. } => "stickyvol volume pull",
            VolumeCommand::Export { .. } => "stickyvol volume export",
            VolumeCommand::Import { .. } => "stickyvol volume import",
        },
    }
}

fn dispatch(command: AdminCommand) -> Result<(), Failure> {
    match command {
        AdminCommand::Volumes(args) => volumes(
            args.socket.path,
            args.pool.as_deref(),
            args.measure,
            args.json,
        ),
        AdminCommand::Volume(args) => {
            let socket = args.socket.path;
            match args.command {
                VolumeCommand::Show { volume_id, json } => show(socket, &volume_id, json),
                VolumeCommand::Delete { volume_id } => delete(socket, &volume_id),
                VolumeCommand::Unfence { volume_id } => unfence(socket, &volume_id),
                VolumeCommand::Pull {
                    volume_id,
                    source_pv,
                    from_disk,
                } => pull(socket, &volume_id, (&source_pv, from_disk.as_deref())),
                VolumeCommand::Export { volume_id, quiet } => export(socket, &volume_id, quiet),
                VolumeCommand::Import {
                    volume_id,
                    replace,
                    quiet,
                } => import(socket, &volume_id, replace, quiet),
            }
        }
    }
}

/// Runs `future` on a runtime of its own: one thread is plenty for one call.
fn block_on<T>(future: impl Future<Output = T>) -> Result<T, Failure> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|err| Failure {
            code: 1,
            message: format!("cannot start the async runtime: {err}"),
        })?;
    Ok(runtime.block_on(future))
}

/// Writes `text` to stdout. A reader that went away (`| head`) is not an error.
fn print_stdout(text: &str) -> Result<(), Failure> {
    let mut stdout = io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(err) if err.kind() != io::ErrorKind::BrokenPipe => Err(Failure {
            code: 1,
            message: format!("writing to stdout: {err}"),
        }),
        _ => Ok(()),
    }
}

fn volumes(socket: PathBuf, pool: Option<&str>, measure: bool, json: bool) -> Result<(), Failure> {
    // Walks take as long as the trees are big.
    let deadline = (!measure).then_some(DESCRIBE_DEADLINE);
    let found = block_on(async {
        let mut admin = Admin::connect(&socket, deadline).await?;
        admin.describe_volumes(pool, measure).await
    })??;
    let found = render::sorted(found);
    if json {
        print_stdout(&render::volumes_json(&found))
    } else if found.is_empty() {
        // Nothing on stdout: a script reading the table sees no rows.
        match pool {
            Some(pool) => eprintln!("no volumes in pool {pool} on this node"),
            None => eprintln!("no volumes on this node"),
        }
        Ok(())
    } else {
        print_stdout(&render::table(&found))
    }
}

fn show(socket: PathBuf, volume_id: &str, json: bool) -> Result<(), Failure> {
    let volume = block_on(async {
        let mut admin = Admin::connect(&socket, Some(DESCRIBE_DEADLINE)).await?;
        admin.describe_volume(volume_id).await
    })??;
    print_stdout(&if json {
        render::volume_json(&volume)
    } else {
        render::details(&volume)
    })
}

fn delete(socket: PathBuf, volume_id: &str) -> Result<(), Failure> {
    block_on(async {
        let mut admin = Admin::connect(&socket, None).await?;
        admin.remove_volume(volume_id).await
    })??;
    print_stdout(&format!("deleted {volume_id}\n"))
}

fn unfence(socket: PathBuf, volume_id: &str) -> Result<(), Failure> {
    let lifted = block_on(async {
        let mut admin = Admin::connect(&socket, None).await?;
        admin.unfence_volume(volume_id).await
    })??;
    if !lifted.was_fenced {
        return print_stdout(&format!("{volume_id} was not fenced\n"));
    }
    for failed in &lifted.failed {
        eprintln!("stickyvol volume unfence: not made writable: {failed}");
    }
    print_stdout(&format!(
        "unfenced {volume_id}: {} mounts writable again\n",
        lifted.mounts_writable
    ))
}

fn pull(
    socket: PathBuf,
    volume_id: &str,
    (source_pv, from_disk): (&str, Option<&str>),
) -> Result<(), Failure> {
    let pulled = block_on(async {
        let mut admin = Admin::connect(&socket, None).await?;
        admin.pull_volume(volume_id, (source_pv, from_disk)).await
    })??;
    let read = match from_disk {
        Some(disk) => format!(" (read from its disk {disk}, mounted here)"),
        None => String::new(),
    };
    print_stdout(&format!(
        "pulled {} bytes ({} of data, {} entries) from PV {source_pv} on node {}{read} into {volume_id}, sha256 {}\n",
        pulled.stream_bytes, pulled.data_bytes, pulled.entries, pulled.source_node, pulled.sha256
    ))
}

/// A File on a duplicate of a standard descriptor: unbuffered (we buffer ourselves, in big
/// chunks), `Send`, and `fstat`-able.
fn duplicate(fd: std::os::fd::BorrowedFd<'_>, what: &str) -> Result<File, Failure> {
    let file = fd
        .try_clone_to_owned()
        .map(File::from)
        .map_err(|err| Failure {
            code: 1,
            message: format!("cannot use {what}: {err}"),
        })?;
    widen_pipe(&file);
    Ok(file)
}

/// Pipe capacity asked for when stdin or stdout is a pipe (the kernel's default is 64 KiB).
const PIPE_BYTES: libc::c_int = 1 << 20;

/// Gives a pipe room for a whole 1 MiB message, so `export | import` moves data in a few large
/// writes instead of many 64 KiB handoffs between the two processes. Best effort: a pipe that
/// stays small only costs speed.
fn widen_pipe(file: &File) {
    use nix::fcntl::{FcntlArg, fcntl};
    use std::os::unix::fs::FileTypeExt;
    if file.metadata().is_ok_and(|m| m.file_type().is_fifo()) {
        let _ = fcntl(file, FcntlArg::F_SETPIPE_SZ(PIPE_BYTES));
    }
}

/// Whether the meter should run: a person watches stderr and did not ask for quiet.
fn show_progress(quiet: bool) -> bool {
    !quiet && io::stderr().is_terminal()
}

fn export(socket: PathBuf, volume_id: &str, quiet: bool) -> Result<(), Failure> {
    if io::stdout().is_terminal() {
        return Err(Failure::refused(
            "refusing to write a binary stream to a terminal; redirect it to a file or pipe it \
             to `stickyvol volume import` on another node",
        ));
    }
    let out = duplicate(io::stdout().as_fd(), "stdout")?;
    let meter = RefCell::new(Meter::stderr(show_progress(quiet)));
    let length = block_on(async {
        let mut admin = Admin::connect(&socket, None).await?;
        admin
            .export_volume(
                volume_id,
                out,
                |start| {
                    if !quiet {
                        eprintln!("{}", export_note(volume_id, start));
                    }
                    meter.borrow_mut().set_total(Some(start.data_bytes));
                },
                |done| meter.borrow_mut().update(done),
            )
            .await
    })??;
    meter.borrow_mut().finish(length);
    if !quiet {
        eprintln!("exported {length} bytes from {volume_id}");
    }
    Ok(())
}

/// `exporting sv-… directly: 1.2Gi of file data`.
fn export_note(volume_id: &str, start: &crate::admin_api::ExportStart) -> String {
    let source = if start.source.is_empty() {
        String::new()
    } else {
        format!(" {}", start.source)
    };
    format!(
        "exporting {volume_id}{source}: {} of file data",
        render::human_size(start.data_bytes)
    )
}

fn import(socket: PathBuf, volume_id: &str, replace: bool, quiet: bool) -> Result<(), Failure> {
    if io::stdin().is_terminal() {
        return Err(Failure::refused(
            "refusing to read a binary stream from a terminal; redirect a file to it or pipe \
             `stickyvol volume export` from another node into it",
        ));
    }
    let mut input = duplicate(io::stdin().as_fd(), "stdin")?;
    let total = remaining_in_file(&mut input);
    let mut meter = Meter::stderr(show_progress(quiet));
    meter.set_total(total);
    let response = block_on(async {
        let mut admin = Admin::connect(&socket, None).await?;
        admin
            .import_volume(volume_id, replace, input, |done| meter.update(done))
            .await
    })??;
    meter.finish(response.stream_bytes);
    if !quiet {
        eprintln!(
            "imported {} bytes ({} bytes of data, {} entries) into {volume_id}, sha256 {}",
            response.stream_bytes, response.data_bytes, response.entries, response.sha256
        );
    }
    Ok(())
}

/// What is left to read when `input` is a regular file (a pipe's size is not known).
fn remaining_in_file(input: &mut File) -> Option<u64> {
    let metadata = input.metadata().ok()?;
    if !metadata.is_file() {
        return None;
    }
    let position = input.stream_position().ok()?;
    Some(metadata.len().saturating_sub(position))
}

#[cfg(test)]
mod tests {
    use super::*;

    use clap::Parser;

    use crate::admin_api::ExportStart;

    /// The commands as `main` mounts them.
    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        command: AdminCommand,
    }

    fn parse(args: &[&str]) -> AdminCommand {
        Cli::try_parse_from(std::iter::once("stickyvol").chain(args.iter().copied()))
            .unwrap()
            .command
    }

    #[test]
    fn the_admin_socket_flag_works_before_and_after_the_subcommand() {
        let AdminCommand::Volume(args) = parse(&["volume", "show", "sv-1"]) else {
            panic!("not a volume command");
        };
        assert_eq!(args.socket.path, PathBuf::from(DEFAULT_ADMIN_SOCKET));
        let AdminCommand::Volume(args) = parse(&["volume", "--admin-socket", "/a", "show", "x"])
        else {
            panic!("not a volume command");
        };
        assert_eq!(args.socket.path, PathBuf::from("/a"));
        let AdminCommand::Volume(args) =
            parse(&["volume", "delete", "sv-1", "--admin-socket", "/run/a.sock"])
        else {
            panic!("not a volume command");
        };
        assert_eq!(args.socket.path, PathBuf::from("/run/a.sock"));
        assert!(matches!(args.command, VolumeCommand::Delete { volume_id } if volume_id == "sv-1"));
    }

    #[test]
    fn volumes_flags() {
        let AdminCommand::Volumes(args) = parse(&["volumes", "--json", "--pool", "fast"]) else {
            panic!("not the volumes command");
        };
        assert!(args.json);
        assert_eq!(args.pool.as_deref(), Some("fast"));
        let AdminCommand::Volume(args) = parse(&["volume", "import", "sv-1", "--replace", "-q"])
        else {
            panic!("not a volume command");
        };
        assert!(matches!(
            args.command,
            VolumeCommand::Import {
                replace: true,
                quiet: true,
                ..
            }
        ));
    }

    #[test]
    fn export_note_names_the_source() {
        let start = ExportStart {
            data_bytes: 3 << 30,
            source: "directly".into(),
        };
        assert_eq!(
            export_note("sv-1", &start),
            "exporting sv-1 directly: 3.0Gi of file data"
        );
        let start = ExportStart {
            data_bytes: 0,
            source: "from a temporary snapshot (the volume is published)".into(),
        };
        assert_eq!(
            export_note("sv-1", &start),
            "exporting sv-1 from a temporary snapshot (the volume is published): 0 of file data"
        );
    }

    #[test]
    fn the_remaining_size_of_a_regular_file() {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&[7; 1000]).unwrap();
        file.seek(io::SeekFrom::Start(100)).unwrap();
        assert_eq!(remaining_in_file(&mut file), Some(900));
        let (reader, _writer) = std::io::pipe().unwrap();
        let mut pipe = File::from(std::os::fd::OwnedFd::from(reader));
        assert_eq!(remaining_in_file(&mut pipe), None);
    }
}
