//! Run files (`--config FILE.toml`, or `RLCR_CONFIG=FILE.toml`): the flags of a run's stages in one
//! file, merged into a command line before it is parsed. The merge reads the stages' flags from
//! the clap definition it is given (names, aliases, switches, counts), so the file accepts exactly
//! what the command line accepts.
//!
//! Two shapes of file:
//!
//! - **A run file**: one file for every stage of a run. Top-level keys are the global flags
//!   (`seed`, `device`, `verbose`, `quiet`, `trace`); each stage's flags sit in a table named after
//!   the stage (`[generate-answers]`, `[score]`, `[update]`, …), and each stage reads its own
//!   table and ignores the others. This is the layout of a verl or TRL run config (one file, a
//!   section per component), so one file describes a loop, and a Makefile loop only has to export
//!   `RLCR_CONFIG` once.
//! - **A stage file**: no tables at all; every key is a flag of the stage being run (or a global
//!   flag).
//!
//! Keys are flag names (`num-answers` or `num_answers`); `true` is a bare flag, `false` leaves it
//! out, arrays repeat the flag (`stop = ["\n\n", "END"]`), a count flag takes a number
//! (`verbose = 2`). Flags on the command line win: a key whose flag is also on the command line
//! is dropped, whatever the order of the two.
//!
//! The whole file is checked on every run, not only the running stage's table: a section that is
//! not a stage, a key that is not a flag of its stage, or a stage flag at the top level of a run
//! file is an error naming the file, the section and the key (a typo in `[update]` stops the
//! loop at its first stage, not an hour later).
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Arg, ArgAction, Command};

use crate::UsageError;

/// The command line with the file's flags merged in, and where each merged flag came from.
#[derive(Debug, Clone, Default)]
pub struct Merged {
    /// The arguments to parse.
    pub argv: Vec<OsString>,
    /// `(--flag, "FILE [section]")` of each flag taken from the file.
    pub from_file: Vec<(String, String)>,
}

/// Merge the config file named by `--config FILE` in `argv`, else by `env_file`
/// (`RLCR_CONFIG`), into `argv` for the command `cmd`. Nothing to merge, or no subcommand on the
/// line (e.g. `rlcr --help`) with only `env_file`: `argv` unchanged.
pub fn merge(cmd: &Command, argv: Vec<OsString>, env_file: Option<&Path>) -> Result<Merged> {
    let (argv, flag_file) = take_config_flag(argv)?;
    let explicit = flag_file.is_some();
    let Some(path) = flag_file.or_else(|| env_file.map(Path::to_path_buf)) else {
        return Ok(Merged {
            argv,
            from_file: vec![],
        });
    };
    let Some((at, stage)) = find_subcommand(cmd, &argv) else {
        if explicit {
            return Err(UsageError("--config needs a subcommand".into()).into());
        }
        return Ok(Merged {
            argv,
            from_file: vec![],
        });
    };
    let name = path.display().to_string();
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading config file {name}"))?;
    let table: toml::Table =
        toml::from_str(&text).with_context(|| format!("parsing config file {name}"))?;
    let entries = entries_for(cmd, &table, &name, &stage)?;
    let on_line = flags_on_line(cmd, &stage, &argv);
    let mut extra = Vec::new();
    let mut from_file = Vec::new();
    for e in entries {
        if on_line.contains(e.arg.get_id().as_str()) {
            continue;
        }
        let flag = format!("--{}", e.arg.get_long().unwrap_or_default());
        let n = extra.len();
        push_value(&mut extra, &flag, e.arg, &e.value)
            .with_context(|| format!("config file {name}: key `{}` in {}", e.key, e.section))?;
        if extra.len() > n {
            from_file.push((flag, format!("{name} {}", e.section)));
        }
    }
    let mut out = argv;
    out.splice(at + 1..at + 1, extra);
    Ok(Merged {
        argv: out,
        from_file,
    })
}

/// Remove `--config FILE` / `--config=FILE` (the last one wins) from `argv`.
fn take_config_flag(argv: Vec<OsString>) -> Result<(Vec<OsString>, Option<PathBuf>)> {
    let mut out = Vec::with_capacity(argv.len());
    let mut file = None;
    let mut it = argv.into_iter();
    while let Some(a) = it.next() {
        let s = a.to_string_lossy().into_owned();
        if s == "--" {
            out.push(a);
            out.extend(it);
            break;
        }
        if s == "--config" {
            let Some(v) = it.next() else {
                return Err(UsageError("--config needs a FILE.toml".into()).into());
            };
            file = Some(PathBuf::from(v));
        } else if let Some(v) = s.strip_prefix("--config=") {
            file = Some(PathBuf::from(v));
        } else {
            out.push(a);
        }
    }
    Ok((out, file))
}

/// The index and name of the subcommand in `argv`: the first argument after the program name
/// that is not an option (or an option's value) of the top-level command.
fn find_subcommand(cmd: &Command, argv: &[OsString]) -> Option<(usize, String)> {
    let mut i = 1;
    while i < argv.len() {
        let s = argv[i].to_string_lossy();
        if s == "--" {
            return None;
        }
        if let Some(long) = s.strip_prefix("--") {
            if !long.contains('=') {
                let takes = cmd
                    .get_arguments()
                    .find(|a| a.get_long() == Some(long))
                    .is_some_and(takes_value);
                if takes {
                    i += 1;
                }
            }
        } else if !s.starts_with('-') {
            return cmd
                .get_subcommands()
                .find(|c| c.get_name() == s || c.get_all_aliases().any(|a| a == s))
                .map(|c| (i, c.get_name().to_string()));
        }
        i += 1;
    }
    None
}

fn takes_value(a: &Arg) -> bool {
    a.get_action().takes_values()
}

/// The global flags of `cmd` a file may set (all but `--config` itself).
fn globals(cmd: &Command) -> impl Iterator<Item = &Arg> {
    cmd.get_arguments()
        .filter(|a| a.is_global_set() && a.get_long() != Some("config"))
}

/// The flag named `key` (underscores read as dashes) among `args`, by long name or alias.
fn find_flag<'a>(mut args: impl Iterator<Item = &'a Arg>, key: &str) -> Option<&'a Arg> {
    let key = key.replace('_', "-");
    args.find(|a| {
        a.get_long() == Some(key.as_str())
            || a.get_all_aliases()
                .is_some_and(|al| al.contains(&key.as_str()))
    })
}

/// A key of the file resolved to its flag.
struct Entry<'a> {
    key: String,
    section: String,
    arg: &'a Arg,
    value: toml::Value,
}

/// The entries that apply to `stage`, after checking the whole file.
fn entries_for<'a>(
    cmd: &'a Command,
    table: &toml::Table,
    file: &str,
    stage: &str,
) -> Result<Vec<Entry<'a>>> {
    let is_run_file = table.values().any(|v| v.is_table());
    let stages: Vec<&Command> = cmd.get_subcommands().collect();
    let stage_cmd = |name: &str| stages.iter().copied().find(|c| c.get_name() == name);
    let mut out = Vec::new();
    // Sections first (every one checked), then the top-level keys.
    for (section, v) in table {
        let Some(sub_table) = v.as_table() else {
            continue;
        };
        let Some(sub) = stage_cmd(section) else {
            let names: Vec<&str> = stages
                .iter()
                .filter(|c| !c.is_hide_set())
                .map(|c| c.get_name())
                .collect();
            bail!(UsageError(format!(
                "config file {file}: unknown section [{section}]{}; sections are named after \
                 the stages: {}",
                suggest(section, names.iter().copied()),
                names.join(", ")
            )));
        };
        for (key, value) in sub_table {
            let Some(arg) = find_flag(sub.get_arguments().chain(globals(cmd)), key) else {
                bail!(UsageError(format!(
                    "config file {file}: unknown key `{key}` in [{section}]: `rlcr {section}` \
                     has no --{}{}",
                    key.replace('_', "-"),
                    suggest(key, flag_names(sub.get_arguments().chain(globals(cmd))))
                )));
            };
            if sub.get_name() == stage {
                out.push(Entry {
                    key: key.clone(),
                    section: format!("[{section}]"),
                    arg,
                    value: value.clone(),
                });
            }
        }
    }
    let sub = stage_cmd(stage);
    let mut top = Vec::new();
    for (key, value) in table.iter().filter(|(_, v)| !v.is_table()) {
        let arg = if is_run_file {
            find_flag(globals(cmd), key).ok_or_else(|| {
                UsageError(format!(
                    "config file {file}: unknown key `{key}` at the top level: only global \
                     flags ({}) go there; a stage's flags go in its section, e.g. [{stage}]",
                    flag_names(globals(cmd)).collect::<Vec<_>>().join(", ")
                ))
            })?
        } else {
            let args = sub.into_iter().flat_map(|s| s.get_arguments());
            find_flag(args.chain(globals(cmd)), key).ok_or_else(|| {
                let args = sub.into_iter().flat_map(|s| s.get_arguments());
                UsageError(format!(
                    "config file {file}: unknown key `{key}`: `rlcr {stage}` has no --{}{}",
                    key.replace('_', "-"),
                    suggest(key, flag_names(args.chain(globals(cmd))))
                ))
            })?
        };
        top.push(Entry {
            key: key.clone(),
            section: "(top level)".to_string(),
            arg,
            value: value.clone(),
        });
    }
    // The top level first: a stage's own table wins over it (later flags override).
    top.extend(out);
    Ok(top)
}

/// Long names of `args` that a file may set.
fn flag_names<'a>(args: impl Iterator<Item = &'a Arg>) -> impl Iterator<Item = &'a str> {
    args.filter(|a| !a.is_hide_set())
        .filter_map(|a| a.get_long())
        .filter(|l| !matches!(*l, "help" | "version" | "config"))
}

/// `; did you mean `x`?` for the closest of `names` within two edits of `key`, else nothing.
fn suggest<'a>(key: &str, names: impl Iterator<Item = &'a str>) -> String {
    let key = key.replace('_', "-");
    names
        .map(|n| (edit_distance(&key, n), n))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, n)| format!(" (did you mean `{n}`?)"))
        .unwrap_or_default()
}

/// Levenshtein distance over chars.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// Ids of the flags given on the command line (long, `--long=v`, short, bundled shorts), among
/// the top-level command's and `stage`'s arguments.
fn flags_on_line(cmd: &Command, stage: &str, argv: &[OsString]) -> BTreeSet<String> {
    let sub = cmd.get_subcommands().find(|c| c.get_name() == stage);
    let args: Vec<&Arg> = cmd
        .get_arguments()
        .chain(sub.into_iter().flat_map(|s| s.get_arguments()))
        .collect();
    let mut ids = BTreeSet::new();
    for a in argv.iter().skip(1) {
        let s = a.to_string_lossy();
        if s == "--" {
            break;
        }
        if let Some(long) = s.strip_prefix("--") {
            let long = long.split('=').next().unwrap_or_default();
            if let Some(arg) = find_flag(args.iter().copied(), long) {
                ids.insert(arg.get_id().to_string());
            }
        } else if let Some(shorts) = s.strip_prefix('-') {
            for c in shorts.chars() {
                let Some(arg) = args.iter().find(|x| x.get_short() == Some(c)) else {
                    break;
                };
                ids.insert(arg.get_id().to_string());
                if takes_value(arg) {
                    break;
                }
            }
        }
    }
    ids
}

/// Append the flag for one value of the file.
fn push_value(out: &mut Vec<OsString>, flag: &str, arg: &Arg, v: &toml::Value) -> Result<()> {
    let count = matches!(arg.get_action(), ArgAction::Count);
    let switch = matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse);
    match v {
        toml::Value::Boolean(b) if switch || count => {
            if *b {
                out.push(flag.into());
            }
        }
        toml::Value::Integer(n) if count => {
            if *n < 0 {
                bail!("a count must be ≥ 0, got {n}");
            }
            for _ in 0..*n {
                out.push(flag.into());
            }
        }
        _ if switch || count => bail!("{flag} is a switch: write true or false"),
        toml::Value::Boolean(b) => {
            out.push(flag.into());
            out.push(b.to_string().into());
        }
        toml::Value::String(s) => {
            out.push(flag.into());
            out.push(s.into());
        }
        toml::Value::Integer(i) => {
            out.push(flag.into());
            out.push(i.to_string().into());
        }
        toml::Value::Float(f) => {
            out.push(flag.into());
            out.push(f.to_string().into());
        }
        toml::Value::Array(items) => {
            for it in items {
                if it.is_array() || it.is_table() {
                    bail!("only strings, numbers and booleans are allowed in an array");
                }
                push_value(out, flag, arg, it)?;
            }
        }
        _ => bail!("only strings, numbers, booleans and arrays are allowed"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn cmd() -> Command {
        let mut c = crate::cli::Cli::command();
        c.build();
        c
    }

    fn merge_text(text: &str, argv: &[&str]) -> Result<Merged> {
        let d = tempfile::tempdir().expect("tmp");
        let p = d.path().join("run.toml");
        std::fs::write(&p, text).expect("write");
        let mut v: Vec<OsString> = argv.iter().map(OsString::from).collect();
        v.push("--config".into());
        v.push(p.clone().into());
        merge(&cmd(), v, None).map(|mut m| {
            for (_, origin) in &mut m.from_file {
                *origin = origin.replace(&p.display().to_string(), "run.toml");
            }
            m
        })
    }

    fn strs(m: &Merged) -> Vec<String> {
        m.argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    const RUN: &str = r#"
seed = 7
device = "cpu"

[generate-answers]
num-answers = 4
temperature = 0.7
stop = ["END", "STOP"]

[update]
lr = 2e-6
"#;

    #[test]
    fn a_run_file_gives_each_stage_its_section_and_the_globals() {
        let m = merge_text(RUN, &["rlcr", "update", "--input", "t.parquet"]).expect("merge");
        assert_eq!(
            strs(&m),
            [
                "rlcr",
                "update",
                "--device",
                "cpu",
                "--seed",
                "7",
                "--lr",
                "0.000002",
                "--input",
                "t.parquet"
            ]
        );
        assert!(m
            .from_file
            .contains(&("--lr".to_string(), "run.toml [update]".to_string())));
        let m = merge_text(RUN, &["rlcr", "generate-answers"]).expect("merge");
        assert_eq!(
            strs(&m)[2..],
            [
                "--device",
                "cpu",
                "--seed",
                "7",
                "--num-answers",
                "4",
                "--stop",
                "END",
                "--stop",
                "STOP",
                "--temperature",
                "0.7"
            ]
        );
        // A stage without a section gets the globals only.
        let m = merge_text(RUN, &["rlcr", "score"]).expect("merge");
        assert_eq!(strs(&m)[2..], ["--device", "cpu", "--seed", "7"]);
    }

    /// Before, a global flag given before the subcommand lost to the file (the file's flags were
    /// inserted after it), and an array in the file added to the command line's values.
    #[test]
    fn the_command_line_wins_wherever_the_flag_stands() {
        let m = merge_text(
            RUN,
            &["rlcr", "--seed", "3", "generate-answers", "--stop=X"],
        )
        .expect("merge");
        let s = strs(&m);
        assert_eq!(s.iter().filter(|a| *a == "--seed").count(), 1, "{s:?}");
        assert!(s.contains(&"3".to_string()) && !s.contains(&"7".to_string()));
        assert!(!s.contains(&"END".to_string()), "{s:?}");
        assert!(s.contains(&"--num-answers".to_string()));
    }

    #[test]
    fn a_stage_file_keeps_working() {
        let m = merge_text(
            "num_answers = 2\nseed = 5\nquiet = true\nverbose = 2\n",
            &["rlcr", "generate-answers", "-o", "x"],
        )
        .expect("merge");
        assert_eq!(
            strs(&m)[2..],
            [
                "--num-answers",
                "2",
                "--quiet",
                "--seed",
                "5",
                "--verbose",
                "--verbose",
                "-o",
                "x"
            ]
        );
    }

    #[test]
    fn typos_are_errors_naming_the_file_the_section_and_the_key() {
        let cases = [
            (
                "[update]\nlrr = 1e-6\n",
                "unknown key `lrr` in [update]",
                "did you mean `lr`?",
            ),
            (
                "[updat]\nlr = 1e-6\n",
                "unknown section [updat]",
                "did you mean `update`?",
            ),
            (
                "lr = 1e-6\n[update]\nlr = 1\n",
                "unknown key `lr` at the top level",
                "[score]",
            ),
            (
                "seeed = 2\n",
                "unknown key `seeed`: `rlcr score`",
                "did you mean `seed`?",
            ),
            // A typo in another stage's section is caught too.
            (
                "[generate-answers]\ntemprature = 1\n",
                "in [generate-answers]",
                "temperature",
            ),
        ];
        for (text, want, hint) in cases {
            let e = merge_text(text, &["rlcr", "score"]).expect_err(text);
            let msg = format!("{e:#}");
            assert!(
                msg.contains("run.toml") || msg.contains("config file"),
                "{msg}"
            );
            assert!(msg.contains(want) && msg.contains(hint), "{text}: {msg}");
            assert!(e.downcast_ref::<UsageError>().is_some(), "{msg}");
        }
    }

    #[test]
    fn values_of_the_wrong_shape_are_errors() {
        let e = merge_text("[score]\nquiet = 3\n", &["rlcr", "score"]).expect_err("switch");
        assert!(format!("{e:#}").contains("key `quiet` in [score]"), "{e:#}");
        let e = merge_text("[score]\nstop = [[1]]\n", &["rlcr", "generate-answers"]);
        assert!(e.is_err());
    }

    #[test]
    fn the_environment_file_applies_only_with_a_subcommand() {
        let d = tempfile::tempdir().expect("tmp");
        let p = d.path().join("run.toml");
        std::fs::write(&p, RUN).expect("write");
        let argv = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        let m = merge(&cmd(), argv(&["rlcr", "--help"]), Some(&p)).expect("no stage");
        assert_eq!(strs(&m), ["rlcr", "--help"]);
        let m = merge(&cmd(), argv(&["rlcr", "update"]), Some(&p)).expect("stage");
        assert!(strs(&m).contains(&"--lr".to_string()));
        // --config wins over the environment.
        let other = d.path().join("other.toml");
        std::fs::write(&other, "[update]\nlr = 5\n").expect("write");
        let mut v = argv(&["rlcr", "update", "--config"]);
        v.push(other.into());
        let m = merge(&cmd(), v, Some(&p)).expect("explicit");
        assert_eq!(strs(&m)[2..], ["--lr", "5"]);
        let e = merge(&cmd(), argv(&["rlcr", "--config", "x.toml"]), None).expect_err("no stage");
        assert!(e.to_string().contains("needs a subcommand"));
    }

    #[test]
    fn edit_distance_counts_edits() {
        assert_eq!(edit_distance("lr", "lr"), 0);
        assert_eq!(edit_distance("lrr", "lr"), 1);
        assert_eq!(edit_distance("temprature", "temperature"), 1);
        assert_eq!(edit_distance("abc", "xyz"), 3);
    }
}
