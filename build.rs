//! Build script: the git commit that `rlcr --version` prints, as the compile-time variable
//! `RLCR_GIT_COMMIT`.
//!
//! Sources, in order: the git checkout the package sits at the root of (`git rev-parse HEAD`);
//! the `.cargo_vcs_info.json` that `cargo package` writes into a crate tarball (its `git.sha1`,
//! with `-dirty` when it was packaged from a modified tree); else `unknown` (a tarball or copy
//! with neither). No dependency is compiled for it.
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let root = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    println!("cargo:rerun-if-changed=build.rs");
    let commit = from_git(&root)
        .or_else(|| from_vcs_info(&root))
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=RLCR_GIT_COMMIT={commit}");
}

/// `git` run in `root`, its trimmed stdout when it succeeds.
fn git(root: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(root)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

/// HEAD of the checkout whose top level is `root` (a package unpacked inside another repository
/// does not take that repository's commit), and the files to watch so that a new commit or a
/// checkout reruns this script.
fn from_git(root: &Path) -> Option<String> {
    let top = PathBuf::from(git(root, &["rev-parse", "--show-toplevel"])?);
    if top.canonicalize().ok()? != root.canonicalize().ok()? {
        return None;
    }
    let commit = git(root, &["rev-parse", "HEAD"])?;
    let mut watch = vec!["HEAD".to_string(), "packed-refs".to_string()];
    if let Some(branch) = git(root, &["symbolic-ref", "-q", "HEAD"]) {
        watch.push(branch);
    }
    for w in watch {
        if let Some(p) = git(root, &["rev-parse", "--git-path", &w]) {
            let p = root.join(p);
            // A missing file would rerun the script on every build.
            if p.exists() {
                println!("cargo:rerun-if-changed={}", p.display());
            }
        }
    }
    Some(commit)
}

/// `git.sha1` (and `git.dirty`) of the `.cargo_vcs_info.json` in a packaged crate.
fn from_vcs_info(root: &Path) -> Option<String> {
    let path = root.join(".cargo_vcs_info.json");
    let text = std::fs::read_to_string(&path).ok()?;
    println!("cargo:rerun-if-changed={}", path.display());
    let at = text.find("\"sha1\"")?;
    let rest = &text[at + 6..];
    let start = rest.find('"')? + 1;
    let sha: String = rest[start..]
        .chars()
        .take_while(|c| c.is_ascii_hexdigit())
        .collect();
    if sha.len() < 7 {
        return None;
    }
    let dirty = text.contains("\"dirty\": true") || text.contains("\"dirty\":true");
    Some(if dirty { format!("{sha}-dirty") } else { sha })
}
