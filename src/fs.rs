//! The filesystem helpers every stage uses: nothing a stage writes is ever half there.
//!
//! - [`AtomicFile`] / [`write_atomic`]: a file is written as `.NAME.rlcr-tmp-PID` beside its
//!   target (permissions 0644 set first, since temp files start 0600), `fsync`ed and renamed over
//!   the target only when the stage has succeeded; dropped uncommitted, the temp file goes.
//! - [`write_folder`]: the same for a folder (checkpoints, imported models): filled as
//!   `.NAME.tmp-PID`, every file `fsync`ed, then renamed into place, the previous folder moved
//!   aside as `.NAME.old-PID` for the moment between the two renames (and put back by the next
//!   run if a run is killed right there).
//! - [`remove_stale`]: what killed runs left behind (their PID is gone) is removed by the next run
//!   that writes the same output.
//! - [`check_distinct`]: rlcr never modifies an input, also not through links.
//! - [`slow_write_hook`]: lets the crash tests kill a stage mid-write.
//!
//! This module depends on nothing else in the crate: tables, traces, checkpoints, imported models
//! and reports all write through it.
use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// Refuse to write `out` when it is the same file as one of `inputs` (also through links).
pub fn check_distinct(inputs: &[&Path], out: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let Ok(om) = std::fs::metadata(out) else {
        // A new output can alias an input only through a not-yet-existing path: compare names.
        for i in inputs {
            if let (Ok(a), Some(b)) = (std::fs::canonicalize(i), canonical_new(out)) {
                if a == b {
                    bail!(
                        "the output {} is the input {}: rlcr never modifies an input",
                        out.display(),
                        i.display()
                    );
                }
            }
        }
        return Ok(());
    };
    for i in inputs {
        if let Ok(im) = std::fs::metadata(i) {
            if im.dev() == om.dev() && im.ino() == om.ino() {
                bail!(
                    "the output {} is the same file as the input {}: rlcr never modifies an input",
                    out.display(),
                    i.display()
                );
            }
        }
    }
    Ok(())
}

fn canonical_new(p: &Path) -> Option<PathBuf> {
    let parent = p.parent().filter(|x| !x.as_os_str().is_empty());
    let dir = std::fs::canonicalize(parent.unwrap_or(Path::new("."))).ok()?;
    Some(dir.join(p.file_name()?))
}

/// The last component of `path` (else the error `{path}: {what}`) and the folder it is in (`.`
/// for a bare name).
fn name_and_parent(path: &Path, what: &str) -> Result<(String, PathBuf)> {
    let name = path
        .file_name()
        .with_context(|| format!("{}: {what}", path.display()))?
        .to_string_lossy()
        .to_string();
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((name, parent))
}

/// An atomically written file: a temp file beside the target, renamed into place on `commit`,
/// removed on drop otherwise.
pub struct AtomicFile {
    target: PathBuf,
    tmp: PathBuf,
    file: Option<File>,
}

impl AtomicFile {
    /// Create the temp file for `target` (creating the target's folder if needed).
    pub fn create(target: &Path) -> Result<Self> {
        use std::os::unix::fs::PermissionsExt;
        let (name, dir) = name_and_parent(target, "not a file path")?;
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("{}: cannot create folder", dir.display()))?;
        if target.is_dir() {
            bail!(
                "{}: the output is a folder, expected a file",
                target.display()
            );
        }
        remove_stale_temps(&dir, &name);
        let tmp = dir.join(format!(".{name}.rlcr-tmp-{}", std::process::id()));
        let file = File::create(&tmp)
            .with_context(|| format!("{}: cannot create temp file", tmp.display()))?;
        file.set_permissions(std::fs::Permissions::from_mode(0o644))
            .with_context(|| format!("{}: cannot set permissions", tmp.display()))?;
        Ok(AtomicFile {
            target: target.to_path_buf(),
            tmp,
            file: Some(file),
        })
    }

    /// The temp file's path (removed on drop unless committed).
    pub fn temp_path(&self) -> &Path {
        &self.tmp
    }

    /// The open temp file.
    pub fn file(&mut self) -> Result<&mut File> {
        self.file
            .as_mut()
            .context("internal error: atomic file already committed")
    }

    /// Take the file out (to hand it to a writer that owns it); give it back with `commit_file`.
    pub fn take(&mut self) -> Result<File> {
        self.file
            .take()
            .context("internal error: atomic file already taken")
    }

    /// fsync the file and rename it over the target.
    pub fn commit_file(mut self, file: File) -> Result<()> {
        slow_write_hook();
        file.sync_all()
            .with_context(|| format!("{}: fsync failed", self.tmp.display()))?;
        drop(file);
        std::fs::rename(&self.tmp, &self.target).with_context(|| {
            format!(
                "cannot rename {} to {}",
                self.tmp.display(),
                self.target.display()
            )
        })?;
        if let Some(dir) = self.target.parent().filter(|d| !d.as_os_str().is_empty()) {
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
        }
        self.tmp = PathBuf::new();
        Ok(())
    }

    /// Commit the file held inside.
    pub fn commit(mut self) -> Result<()> {
        let f = self.take()?;
        self.commit_file(f)
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if !self.tmp.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Remove temp files left by killed runs writing the same output (their process is gone).
fn remove_stale_temps(dir: &Path, name: &str) {
    remove_stale(dir, &format!(".{name}.rlcr-tmp-"), "");
}

/// Remove the entries of `dir` named `PREFIX<pid>SUFFIX` whose process is gone (files, or folders
/// with their contents): what a killed run left behind. Returns the names removed.
pub fn remove_stale(dir: &Path, prefix: &str, suffix: &str) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return removed;
    };
    for e in rd.flatten() {
        let fname = e.file_name().to_string_lossy().to_string();
        let Some(pid) = fname
            .strip_prefix(prefix)
            .and_then(|r| r.strip_suffix(suffix))
        else {
            continue;
        };
        let alive = pid
            .parse::<u32>()
            .is_ok_and(|p| Path::new(&format!("/proc/{p}")).exists());
        if !alive {
            let p = e.path();
            let gone = if p.is_dir() {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
            if gone.is_ok() {
                removed.push(p);
            }
        }
    }
    removed
}

/// Test hook: with `RLCR_TEST_SLOW_WRITE=MS` in the environment, every output write pauses MS
/// milliseconds after each Parquet batch and before each final rename, so a test can kill a
/// stage while its output is half written (tests/integration/crash.rs). Unset: no effect (read once, in
/// [`crate::switches`]).
pub fn slow_write_hook() {
    let ms = crate::switches::get().test_slow_write_ms;
    if ms > 0 {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// Write a small text/JSON file atomically.
pub fn write_atomic(target: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut a = AtomicFile::create(target)?;
    a.file()?
        .write_all(bytes)
        .with_context(|| format!("{}: write failed", target.display()))?;
    a.commit()
}

/// Prefix of the staging folder of [`fill_folder`] (`OUT/.rlcr-staging-PID`).
pub const STAGING: &str = ".rlcr-staging-";

/// Replace files inside the folder `out` together: `fill` writes into a staging folder
/// `out/.rlcr-staging-PID` (`out` is created if needed), whose files are moved into `out` only
/// when `fill` has succeeded, so a failed or killed run leaves the previous files whole. Unlike
/// [`write_folder`], files of `out` that `fill` does not write stay. A failed `fill`'s staging
/// folder is removed; a killed run's is removed by the next run.
pub fn fill_folder<T>(out: &Path, fill: impl FnOnce(&Path) -> Result<T>) -> Result<T> {
    std::fs::create_dir_all(out)
        .with_context(|| format!("creating the output folder {}", out.display()))?;
    remove_stale(out, STAGING, "");
    let staging = out.join(format!("{STAGING}{}", std::process::id()));
    std::fs::create_dir(&staging).with_context(|| format!("creating {}", staging.display()))?;
    let made = match fill(&staging) {
        Ok(v) => v,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(e);
        }
    };
    let entries =
        std::fs::read_dir(&staging).with_context(|| format!("listing {}", staging.display()))?;
    for e in entries {
        let e = e.with_context(|| format!("listing {}", staging.display()))?;
        let to = out.join(e.file_name());
        std::fs::rename(e.path(), &to)
            .with_context(|| format!("moving {} into place", to.display()))?;
    }
    std::fs::remove_dir_all(&staging).with_context(|| format!("removing {}", staging.display()))?;
    Ok(made)
}

/// Whether the existing folder `dir` is one of `paths` (also through links); false when `dir`
/// does not exist yet. An input that cannot be opened is an error naming it.
pub fn folder_is_one_of(dir: &Path, paths: &[&Path]) -> Result<bool> {
    let Ok(d) = std::fs::canonicalize(dir) else {
        return Ok(false);
    };
    for p in paths {
        let c = std::fs::canonicalize(p)
            .with_context(|| format!("{}: cannot open input", p.display()))?;
        if c == d {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Build a folder atomically: `fill` writes into a fresh temporary folder next to `out`, which is
/// then renamed to `out` (replacing an existing folder). What killed runs left beside `out` is
/// cleaned up first: half-written `.NAME.tmp-PID` folders are removed, and a previous folder moved
/// aside as `.NAME.old-PID` by a run killed between its two renames is put back.
pub fn write_folder(out: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let (name, parent) = name_and_parent(out, "not a folder name")?;
    std::fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;
    // A run killed between the two renames below left the previous folder as `.NAME.old-PID`:
    // put it back first; then drop what killed runs left half written.
    if !out.exists() {
        let prefix = format!(".{name}.old-");
        if let Ok(rd) = std::fs::read_dir(&parent) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().to_string();
                let dead = n
                    .strip_prefix(&prefix)
                    .and_then(|p| p.parse::<u32>().ok())
                    .is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists());
                if dead && !out.exists() {
                    std::fs::rename(e.path(), out)
                        .with_context(|| format!("restoring {} from {n}", out.display()))?;
                }
            }
        }
    }
    remove_stale(&parent, &format!(".{name}.tmp-"), "");
    remove_stale(&parent, &format!(".{name}.old-"), "");
    let pid = std::process::id();
    let tmp = parent.join(format!(".{name}.tmp-{pid}"));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)
            .with_context(|| format!("removing stale {}", tmp.display()))?;
    }
    std::fs::create_dir(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let result = fill(&tmp).and_then(|()| {
        for entry in std::fs::read_dir(&tmp)? {
            let path = entry?.path();
            std::fs::File::open(&path)
                .and_then(|f| f.sync_all())
                .with_context(|| format!("syncing {}", path.display()))?;
        }
        Ok(())
    });
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    slow_write_hook();
    if out.exists() {
        let old = parent.join(format!(".{name}.old-{pid}"));
        std::fs::rename(out, &old).with_context(|| format!("moving aside {}", out.display()))?;
        std::fs::rename(&tmp, out).with_context(|| format!("renaming into {}", out.display()))?;
        std::fs::remove_dir_all(&old).with_context(|| format!("removing {}", old.display()))?;
    } else {
        std::fs::rename(&tmp, out).with_context(|| format!("renaming into {}", out.display()))?;
    }
    if let Ok(d) = File::open(&parent) {
        let _ = d.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn fill_folder_replaces_together_and_keeps_the_rest() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("r");
        fs::create_dir(&out).unwrap();
        fs::write(out.join("keep.txt"), "k").unwrap();
        fs::write(out.join("a.txt"), "old").unwrap();
        // A killed run's staging folder (no such PID) is removed.
        fs::create_dir(out.join(format!("{STAGING}4294967295"))).unwrap();
        let err = fill_folder(&out, |s| -> Result<()> {
            fs::write(s.join("a.txt"), "half").unwrap();
            bail!("failed")
        });
        assert!(err.is_err());
        assert_eq!(fs::read_to_string(out.join("a.txt")).unwrap(), "old");
        let n = fill_folder(&out, |s| {
            fs::write(s.join("a.txt"), "new")?;
            fs::write(s.join("b.txt"), "b")?;
            Ok(2)
        })
        .unwrap();
        assert_eq!(n, 2);
        let mut names: Vec<String> = fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        names.sort();
        assert_eq!(names, ["a.txt", "b.txt", "keep.txt"]);
        assert_eq!(fs::read_to_string(out.join("a.txt")).unwrap(), "new");
    }

    #[test]
    fn folder_is_one_of_sees_through_links() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("o");
        assert!(!folder_is_one_of(&out, &[d.path()]).unwrap());
        fs::create_dir(&out).unwrap();
        std::os::unix::fs::symlink(&out, d.path().join("link")).unwrap();
        assert!(folder_is_one_of(&out, &[&d.path().join("link")]).unwrap());
        assert!(!folder_is_one_of(&out, &[d.path()]).unwrap());
        assert!(folder_is_one_of(&out, &[&d.path().join("missing")]).is_err());
    }

    #[test]
    fn write_folder_cleans_up_after_killed_runs() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("ck");
        // A run killed between its renames: `ck` moved aside as `.ck.old-PID`, its new folder
        // half written as `.ck.tmp-PID` (PID of a process that is gone).
        let old = d.path().join(".ck.old-4000000000");
        fs::create_dir(&old).unwrap();
        fs::write(old.join("a.txt"), "previous").unwrap();
        let stale = d.path().join(".ck.tmp-4000000001");
        fs::create_dir(&stale).unwrap();
        fs::write(stale.join("junk"), "x").unwrap();
        // The next write fails: the previous folder is back in place, nothing else is left.
        let e = write_folder(&out, |_| anyhow::bail!("boom")).unwrap_err();
        assert!(format!("{e:#}").contains("boom"));
        assert_eq!(fs::read_to_string(out.join("a.txt")).unwrap(), "previous");
        let names: Vec<_> = fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        assert_eq!(names, vec!["ck"]);
        // A write that succeeds replaces it.
        write_folder(&out, |tmp| Ok(fs::write(tmp.join("b.txt"), "new")?)).unwrap();
        assert!(!out.join("a.txt").exists());
        assert_eq!(fs::read_to_string(out.join("b.txt")).unwrap(), "new");
    }

    #[test]
    fn atomic_file_commits_or_leaves_nothing() {
        use std::io::Write;
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("a.txt");
        write_atomic(&out, b"one").unwrap();
        assert_eq!(fs::read(&out).unwrap(), b"one");
        {
            let mut a = AtomicFile::create(&out).unwrap();
            a.file().unwrap().write_all(b"two").unwrap();
            // dropped without commit: an error path
        }
        assert_eq!(fs::read(&out).unwrap(), b"one");
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 1);
    }
}
