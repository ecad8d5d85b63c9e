//! The reward adapters (`verl_reward.py`, `trl_reward.py`: verl's `compute_score` and TRL's
//! reward functions as an external verifier) travel inside the binary.
//!
//! Why embedded rather than found next to the binary: an installed binary (`cargo install`, a
//! copied release file) has no repository beside it, and an adapter must speak the protocol of
//! the binary that runs it, which a script found by a path relative to the binary or to the
//! working folder does not guarantee. So the scripts of `scripts/rewards/` are compiled in
//! (`include_str!`, the same files, so they cannot drift) and written, when an external verifier
//! starts, to a folder named by their content hash: `$XDG_CACHE_HOME/rlcr/rewards-HASH`, else
//! `~/.cache/rlcr/rewards-HASH`, else the same under the system's temp folder. The verifier
//! command gets that folder at the front of its `PATH` and as `$RLCR_REWARDS`, so
//! `verl_reward.py my_rewards:compute_score` (or `python3 "$RLCR_REWARDS/verl_reward.py" …`)
//! runs from any folder; the adapters import the user's module from the working folder.
//!
//! Each file is written to a temp file with its mode (the two adapters executable), then renamed
//! into place, so runs started at once (shards of one table) never see a half-written script; a
//! file that already holds the right bytes is left alone. When no folder can be written, the
//! command runs without them (a verifier of one's own does not need them) and says so.
use std::ffi::OsString;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The environment variable naming the adapters' folder in the verifier command.
pub const ENV_DIR: &str = "RLCR_REWARDS";

/// The adapters: (file name, contents, executable).
pub const FILES: [(&str, &str, bool); 3] = [
    (
        "_protocol.py",
        include_str!("../../scripts/rewards/_protocol.py"),
        false,
    ),
    (
        "verl_reward.py",
        include_str!("../../scripts/rewards/verl_reward.py"),
        true,
    ),
    (
        "trl_reward.py",
        include_str!("../../scripts/rewards/trl_reward.py"),
        true,
    ),
];

/// The folder name: `rewards-` and the FNV-1a hash of the files' names and contents.
fn folder_name() -> String {
    let mut bytes = Vec::new();
    for (name, text, exec) in FILES {
        bytes.extend_from_slice(name.as_bytes());
        bytes.push(0);
        bytes.extend_from_slice(text.as_bytes());
        bytes.push(exec as u8);
    }
    format!("rewards-{:016x}", crate::hash::fnv1a64(&bytes))
}

/// Where the adapters' folder goes, in order of preference.
fn candidate_roots() -> Vec<PathBuf> {
    let mut roots = Vec::new();
    match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        Some(x) => roots.push(PathBuf::from(x).join("rlcr")),
        None => {
            if let Some(h) = std::env::var_os("HOME").filter(|v| !v.is_empty()) {
                roots.push(PathBuf::from(h).join(".cache").join("rlcr"));
            }
        }
    }
    roots.push(std::env::temp_dir().join("rlcr"));
    roots
}

/// Write the adapters under `root` (a no-op for files already there); returns their folder.
pub fn write_under(root: &Path) -> Result<PathBuf> {
    let dir = root.join(folder_name());
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    for (name, text, exec) in FILES {
        let target = dir.join(name);
        let mode = if exec { 0o755 } else { 0o644 };
        let same = std::fs::read(&target).is_ok_and(|b| b == text.as_bytes())
            && std::fs::metadata(&target).is_ok_and(|m| m.permissions().mode() & 0o777 == mode);
        if same {
            continue;
        }
        let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(text.as_bytes())?;
            f.set_permissions(std::fs::Permissions::from_mode(mode))?;
            f.sync_all()?;
            std::fs::rename(&tmp, &target)
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&tmp);
            return Err(e).with_context(|| format!("writing {}", target.display()));
        }
    }
    Ok(dir)
}

/// The adapters' folder, written on first use (the first root that can be written).
pub fn folder() -> Result<PathBuf> {
    let mut errors = Vec::new();
    for root in candidate_roots() {
        match write_under(&root) {
            Ok(d) => return Ok(d),
            Err(e) => errors.push(format!("{e:#}")),
        }
    }
    anyhow::bail!(
        "cannot write the reward adapters anywhere: {}",
        errors.join("; ")
    )
}

/// The environment of a verifier command: `$RLCR_REWARDS` and the adapters' folder first on
/// `PATH`. Empty (with a note on stderr) when no folder could be written.
pub fn command_env() -> Vec<(&'static str, OsString)> {
    match folder() {
        Ok(dir) => env_for(&dir),
        Err(e) => {
            crate::info!("{e:#}; the verifier command runs without {ENV_DIR}");
            Vec::new()
        }
    }
}

/// `$RLCR_REWARDS` = `dir`, and `PATH` with `dir` in front.
pub fn env_for(dir: &Path) -> Vec<(&'static str, OsString)> {
    let mut paths = vec![dir.to_path_buf()];
    if let Some(p) = std::env::var_os("PATH") {
        paths.extend(std::env::split_paths(&p));
    }
    let mut env = vec![(ENV_DIR, dir.as_os_str().to_os_string())];
    // a folder whose name holds `:` cannot go on PATH; `$RLCR_REWARDS` still names it
    if let Ok(path) = std::env::join_paths(paths) {
        env.push(("PATH", path));
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_once_executable_and_equal_to_the_scripts() {
        let t = tempfile::tempdir().unwrap();
        let d = write_under(t.path()).unwrap();
        assert!(d.starts_with(t.path()));
        for (name, text, exec) in FILES {
            let p = d.join(name);
            assert_eq!(std::fs::read_to_string(&p).unwrap(), text, "{name}");
            let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, if exec { 0o755 } else { 0o644 }, "{name}");
            // the repository's copy is the one compiled in
            let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("scripts/rewards")
                .join(name);
            assert_eq!(std::fs::read_to_string(repo).unwrap(), text, "{name}");
        }
        // a second write leaves the files alone (same inode), a damaged one is repaired
        use std::os::unix::fs::MetadataExt;
        let ino = std::fs::metadata(d.join("verl_reward.py")).unwrap().ino();
        std::fs::write(d.join("trl_reward.py"), "broken").unwrap();
        assert_eq!(write_under(t.path()).unwrap(), d);
        assert_eq!(
            std::fs::metadata(d.join("verl_reward.py")).unwrap().ino(),
            ino
        );
        assert_eq!(
            std::fs::read_to_string(d.join("trl_reward.py")).unwrap(),
            FILES[2].1
        );
        let left: Vec<_> = std::fs::read_dir(&d).unwrap().collect();
        assert_eq!(left.len(), FILES.len(), "no temp files left");
    }

    #[test]
    fn env_puts_the_folder_first_on_path() {
        let env = env_for(Path::new("/x/rewards-1"));
        assert_eq!(env[0], (ENV_DIR, OsString::from("/x/rewards-1")));
        let path = &env[1];
        assert_eq!(path.0, "PATH");
        let first = std::env::split_paths(&path.1).next().unwrap();
        assert_eq!(first, PathBuf::from("/x/rewards-1"));
    }
}
