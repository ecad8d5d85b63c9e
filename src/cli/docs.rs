//! The command-line reference in `docs/cli/`: one Markdown page per subcommand and an index,
//! generated from the clap definitions, so the pages say what `--help` says. The integration
//! test `cli_pages` fails when a page and the binary's `--help` differ, and rewrites the pages
//! with `RLCR_BLESS=1`.
use clap::Command;

/// The note at the top of every generated page.
const GENERATED: &str = "<!-- Generated from the command-line definitions in src/cli/ by the test \
`cli_pages` (RLCR_BLESS=1 cargo test --test integration cli_pages); do not edit by hand. -->";

/// `(file name, Markdown)` of every page: `index.md`, then `<stage>.md` per visible subcommand.
pub fn pages() -> Vec<(String, String)> {
    let mut cmd = super::command();
    cmd.build();
    let stages: Vec<&Command> = cmd
        .get_subcommands()
        .filter(|c| !c.is_hide_set() && c.get_name() != "help")
        .collect();
    let mut index = format!(
        "{GENERATED}\n\n# Command-line reference\n\n{}\n\n| Command | What it does |\n|---|---|\n",
        cmd.get_about().map(|a| a.to_string()).unwrap_or_default()
    );
    for s in &stages {
        index.push_str(&format!(
            "| [`rlcr {0}`]({0}.md) | {1} |\n",
            s.get_name(),
            s.get_about().map(|a| a.to_string()).unwrap_or_default()
        ));
    }
    index.push_str(&format!(
        "\nEnvironment variables: [environment.md](../environment.md).\n\n## `rlcr --help`\n\n```text\n{}```\n",
        help(&cmd)
    ));
    let mut out = vec![("index.md".to_string(), index)];
    for s in &stages {
        let name = s.get_name();
        out.push((
            format!("{name}.md"),
            format!(
                "{GENERATED}\n\n# rlcr {name}\n\n{}\n\n```text\n{}```\n\n[All commands](index.md) · \
                 [Environment variables](../environment.md)\n",
                s.get_about().map(|a| a.to_string()).unwrap_or_default(),
                help(s)
            ),
        ));
    }
    out
}

/// What `--help` prints for `cmd` (a built command), ending in one newline: the long layout when
/// the command or one of its arguments has a long text (as clap decides), else the short one.
pub fn help(cmd: &Command) -> String {
    let long = cmd.get_long_about().is_some()
        || cmd
            .get_arguments()
            .any(|a| a.get_long_help().is_some() && !a.is_hide_set());
    let mut cmd = cmd.clone();
    let text = if long {
        cmd.render_long_help()
    } else {
        cmd.render_help()
    }
    .to_string();
    format!("{}\n", text.trim_end())
}
