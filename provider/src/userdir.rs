//! The user's own files: the id they belong to and the directories,
//! closed to everyone else, that the state sockets (`diag::stat`) and a
//! shared device's locks (`engine::share`) live in.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::Path;

/// The user the process acts as: the owner of what it creates, and the
/// id a peer's `SO_PEERCRED` reports.
pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Makes `dir` (mode 0700) or checks the one there: a directory, not a
/// link, owned by this user, closed to everyone else. Anything else is
/// refused (another user could otherwise read, plant or take what is
/// in it).
pub(crate) fn private_dir(dir: &Path) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let m = std::fs::symlink_metadata(dir)?;
    if !m.is_dir() || m.uid() != euid() || m.mode() & 0o077 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is not a directory of mode 0700 owned by uid {}",
                dir.display(),
                euid()
            ),
        ));
    }
    Ok(())
}
