//! The stages' cases: for each stage that reads a table or a model, its golden run and every
//! defect of its inputs, checked by [`check_stage`](super::check_stage).
use super::*;

const TRAJ: &str = "rlcr.trajectory";

fn g(p: &Path) -> RecordBatch {
    table::read(p)
}

fn zero_rows(p: &Path, schema: &'static str) -> Case {
    let b = g(p);
    Case::table(
        "zero rows",
        b.slice(0, 0),
        schema,
        &["in.parquet", "no rows"],
    )
}

/// A long context: `n` copies of an ordinary token.
fn long_ids(n: usize) -> Vec<i32> {
    vec![20; n]
}

#[test]
fn generate_answers() {
    let gd = golden();
    let b = g(&gd.prompts);
    let p = "rlcr.prompts";
    let mut cases = file_cases(&gd.prompts);
    cases.extend([
        zero_rows(&gd.prompts, p),
        Case::table(
            "missing column",
            drop_col(&b, "messages"),
            p,
            &["in.parquet", "`messages`", "missing"],
        ),
        Case::table(
            "wrong column type",
            replace(&b, "prompt_id", Arc::new(Int64Array::from(vec![1, 2]))),
            p,
            &["in.parquet", "`prompt_id`", "Int64"],
        ),
        Case::table(
            "null messages",
            null_at(&b, "messages", 1),
            p,
            &["in.parquet", "row 1", "`messages`"],
        ),
        Case::table(
            "messages not JSON",
            set_str(&b, "messages", 1, "[{\"role\": \"user\""),
            p,
            &["in.parquet", "row 1", "`messages`"],
        ),
        Case::table(
            "messages not a list",
            set_str(&b, "messages", 1, "{\"role\": \"user\"}"),
            p,
            &["in.parquet", "row 1", "`messages`"],
        ),
        Case::table(
            "duplicate prompt_id",
            set_str(
                &b,
                "prompt_id",
                1,
                cols::str_col(&b, "t", "prompt_id").unwrap().value(0),
            ),
            p,
            &["in.parquet", "row 1", "`prompt_id`"],
        ),
    ]);
    cases.extend(model_cases());
    check_stage(
        &Stage {
            name: "generate-answers",
            golden: gd.prompts.clone(),
            model: true,
            argv: |i, m, o| {
                s(&[
                    "generate-answers",
                    "--model",
                    m,
                    "--input",
                    i,
                    "-o",
                    o,
                    "--num-answers",
                    "1",
                    "--max-new-tokens",
                    "2",
                ])
            },
            out: "answers.parquet",
            control: true,
        },
        cases,
    );
}

#[test]
fn generate_confidence() {
    let gd = golden();
    let b = g(&gd.answers);
    let mut cases = file_cases(&gd.answers);
    let sid0 = cols::str_col(&b, "t", "sample_id")
        .unwrap()
        .value(0)
        .to_string();
    cases.extend([
        zero_rows(&gd.answers, TRAJ),
        Case::table(
            "missing column",
            drop_col(&b, "response_text"),
            TRAJ,
            &["in.parquet", "`response_text`", "missing"],
        ),
        Case::table(
            "wrong column type",
            replace(
                &b,
                "response_ids",
                Arc::new(StringArray::from(vec!["1 2 3"; 4])),
            ),
            TRAJ,
            &["in.parquet", "`response_ids`", "Utf8"],
        ),
        Case::table(
            "null response_ids",
            null_at(&b, "response_ids", 2),
            TRAJ,
            &["in.parquet", "row 2", "`response_ids`"],
        ),
        Case::table(
            "unknown sample_type",
            set_str(&b, "sample_type", 1, "bogus"),
            TRAJ,
            &["in.parquet", "row 1", "`sample_type`", "bogus"],
        ),
        Case::table(
            "duplicate sample_id",
            set_str(&b, "sample_id", 1, &sid0),
            TRAJ,
            &["in.parquet", "row 1", "`sample_id`"],
        ),
        Case::table(
            "duplicated row",
            keep_rows(&b, &[0, 1, 1, 2, 3]),
            TRAJ,
            &["in.parquet", "row 2"],
        ),
        Case::table(
            "list length mismatch",
            edit_f32s(&b, "response_logprobs", 1, |v| {
                v.pop();
            }),
            TRAJ,
            &["in.parquet", "row 1", "`response_logprobs`"],
        ),
        Case::table(
            "span out of range",
            set_span(&b, "answer_span", 1, (0, 99)),
            TRAJ,
            &["in.parquet", "row 1", "`answer_span`"],
        ),
        Case::table(
            "token id outside the vocabulary",
            edit_ids(&b, "response_ids", 1, |v| v[0] = 5000),
            TRAJ,
            &["in.parquet", "row 1", "`response_ids`", "5000"],
        ),
        Case::table(
            "negative token id",
            edit_ids(&b, "response_ids", 1, |v| v[0] = -3),
            TRAJ,
            &["in.parquet", "row 1", "`response_ids`", "-3"],
        ),
        {
            let long = long_ids(2100);
            let b = replace(
                &b,
                "response_ids",
                cols::build_list_i32(vec![long.clone(); 4]),
            );
            let b = replace(
                &b,
                "response_logprobs",
                cols::build_list_f32(vec![vec![-1.0f32; long.len()]; 4]),
            );
            let b = replace(
                &b,
                "response_text",
                Arc::new(StringArray::from(vec!["x ".repeat(2100); 4])),
            );
            Case::table(
                "context longer than the model's",
                b,
                TRAJ,
                &["in.parquet", "row 0", "2048"],
            )
        },
    ]);
    // The answers table holds no confidence rows: the three tables are made from the trajectory
    // (the validator runs before the stage's own "answer rows only" rule).
    cases.extend(three_bad_tables(&g(&gd.trajectory)));
    cases.extend(model_cases());
    cases.extend(folder_cases(&gd.answers, TRAJ, true));
    check_stage(
        &Stage {
            name: "generate-confidence",
            golden: gd.answers.clone(),
            model: true,
            argv: |i, m, o| {
                s(&[
                    "generate-confidence",
                    "--model",
                    m,
                    "--input",
                    i,
                    "-o",
                    o,
                    "--num-confidences",
                    "1",
                    "--max-new-tokens",
                    "2",
                ])
            },
            out: "trajectory.parquet",
            control: true,
        },
        cases,
    );
}

/// Three bad tables that a stage without its own validator would let through, for every stage that reads a
/// trajectory table (`b` holds answer and confidence rows): a confidence row carrying its answer's
/// `sample_id`, `response_logprobs` longer than `response_ids`, an `answer_span` past the end of
/// the response. Each must fail naming the file, the row and the column, writing nothing.
fn three_bad_tables(b: &RecordBatch) -> Vec<Case> {
    let mut v = trajectory_cases(b);
    v.truncate(3);
    v
}

/// Defects of a trajectory table that every stage reading one checks (rows: `b` is the table):
/// broken identities and links (a duplicated row, an orphan confidence row, a confidence row with
/// its answer's `sample_id`), per-token lists and spans that disagree with `response_ids`. The
/// first three are [`three_bad_tables`].
fn trajectory_cases(b: &RecordBatch) -> Vec<Case> {
    let a1 = row_of(b, "answer", 1);
    // The same answer row twice (a part file copied twice, a bad concat): the second copy.
    let mut dup: Vec<usize> = (0..b.num_rows()).collect();
    dup.insert(a1 + 1, a1);
    let orphan: Vec<usize> = (0..b.num_rows()).filter(|&i| i != a1).collect();
    let orphan_row = a1; // its confidence row moves up into its place
                         // A confidence row carrying its own answer's sample_id.
    let c0 = row_of(b, "confidence", 0);
    let (pid, aidx) = (
        cols::str_col(b, "t", "prompt_id").unwrap(),
        cols::i32_col(b, "t", "answer_idx").unwrap(),
    );
    let parent = (0..b.num_rows())
        .find(|&i| i != c0 && pid.value(i) == pid.value(c0) && aidx.value(i) == aidx.value(c0))
        .unwrap();
    let parent_id = cols::str_col(b, "t", "sample_id")
        .unwrap()
        .value(parent)
        .to_string();
    let second = parent.max(c0);
    let resp_len = lists_i32(b, "response_ids")[a1].len() as i32;
    vec![
        Case::table(
            "confidence row with its answer's sample_id",
            set_str(b, "sample_id", c0, &parent_id),
            TRAJ,
            &["in.parquet", &format!("row {second}"), "`sample_id`"],
        ),
        Case::table(
            "response_logprobs longer than response_ids",
            edit_f32s(b, "response_logprobs", a1, |v| v.push(-1.0)),
            TRAJ,
            &["in.parquet", &format!("row {a1}"), "`response_logprobs`"],
        ),
        Case::table(
            "answer_span past the end of the response",
            set_span(b, "answer_span", a1, (0, resp_len + 3)),
            TRAJ,
            &["in.parquet", &format!("row {a1}"), "`answer_span`"],
        ),
        Case::table(
            "unknown sample_type",
            set_str(b, "sample_type", 1, "bogus"),
            TRAJ,
            &["in.parquet", "row 1", "`sample_type`", "bogus"],
        ),
        Case::table(
            "null sample_type",
            null_at(b, "sample_type", 1),
            TRAJ,
            &["in.parquet", "row 1", "`sample_type`"],
        ),
        Case::table(
            "duplicated row",
            keep_rows(b, &dup),
            TRAJ,
            &["in.parquet", &format!("row {}", a1 + 1)],
        ),
        Case {
            label: "confidence row without its answer".into(),
            ..Case::table(
                "",
                keep_rows(b, &orphan),
                TRAJ,
                &["in.parquet", &format!("row {orphan_row}"), "answer"],
            )
        },
    ]
}

/// The verifier's background `sleep` (pid in `sleeper.pid`) was killed with it (its process group).
fn sleeper_gone(dir: &Path) -> Result<(), String> {
    // The verifier's own child was killed with it (its process group).
    let pid = std::fs::read_to_string(dir.join("sleeper.pid"))
        .map_err(|e| format!("no sleeper.pid: {e}"))?;
    let stat = Path::new("/proc").join(pid.trim()).join("stat");
    for _ in 0..200 {
        match std::fs::read_to_string(&stat) {
            Err(_) => return Ok(()),
            // A zombie (state Z) is dead, waiting for its new parent to reap it.
            Ok(s)
                if s.rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('Z')) =>
            {
                return Ok(())
            }
            Ok(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    Err(format!("the verifier's child {} outlived rlcr", pid.trim()))
}

#[test]
fn score() {
    let gd = golden();
    let b = g(&gd.trajectory);
    let mut cases = file_cases(&gd.trajectory);
    cases.extend([
        zero_rows(&gd.trajectory, TRAJ),
        Case::table(
            "missing column",
            drop_col(&b, "response_text"),
            TRAJ,
            &["in.parquet", "`response_text`", "missing"],
        ),
        Case::table(
            "wrong column type",
            replace(&b, "sample_type", Arc::new(Int32Array::from(vec![0; 8]))),
            TRAJ,
            &["in.parquet", "`sample_type`", "Int32"],
        ),
        Case::table(
            "null response_text",
            null_at(&b, "response_text", 2),
            TRAJ,
            &["in.parquet", "row 2", "`response_text`"],
        ),
        Case::table(
            "null ground_truth",
            null_at(&b, "ground_truth", 2),
            TRAJ,
            &["in.parquet", "row 2", "`ground_truth`"],
        ),
    ]);
    cases.extend(trajectory_cases(&b));
    // External verifiers that crash, die, hang, talk nonsense or do not exist.
    let verifier = |label: &str, cmd: &str, needles: &[&str]| {
        let mut c = Case::new(label, needles).flags(&["--verifier-cmd", cmd]);
        c.child_stderr = true;
        c
    };
    cases.extend([
        verifier(
            "verifier exits 3",
            "exit 3",
            &["external verifier", "exit status: 3"],
        ),
        verifier(
            "verifier killed by a signal",
            "kill -SEGV $$",
            &["external verifier", "SIGSEGV"],
        ),
        verifier(
            "verifier writes garbage",
            "echo garbage; cat > /dev/null",
            &["external verifier", "garbage"],
        ),
        verifier(
            "verifier does not exist",
            "/no/such/verifier-program",
            &["external verifier", "/no/such/verifier-program"],
        ),
        {
            // Hangs (a grandchild holding its pipes); --verifier-timeout 0.5 must end it.
            let mut c = verifier(
                "verifier hangs",
                "sleep 30 & echo $! > sleeper.pid; wait",
                &["external verifier", "0.5", "killed"],
            )
            .flags(&["--verifier-timeout", "0.5"]);
            c.limit = Duration::from_secs(10);
            c.after = Some(sleeper_gone);
            c
        },
        {
            // Answers every request, then does not exit when its input closes.
            let mut c = verifier(
                "verifier does not exit",
                "sed -u 's/^{\"id\":\\([0-9]*\\).*/{\"id\": \\1, \"correct\": false}/'; \
                 sleep 30 & echo $! > sleeper.pid; wait",
                &["external verifier", "did not exit", "killed"],
            )
            .flags(&["--verifier-timeout", "1"]);
            c.limit = Duration::from_secs(10);
            c.after = Some(sleeper_gone);
            c
        },
    ]);
    cases.extend(folder_cases(&gd.trajectory, TRAJ, true));
    check_stage(
        &Stage {
            name: "score",
            golden: gd.trajectory.clone(),
            model: false,
            argv: |i, _, o| s(&["score", "--input", i, "-o", o]),
            out: "scored.parquet",
            control: true,
        },
        cases,
    );
}

#[test]
fn advantage() {
    let gd = golden();
    let b = g(&gd.scored);
    let mut cases = file_cases(&gd.scored);
    let a0 = row_of(&b, "answer", 0);
    cases.extend([
        zero_rows(&gd.scored, TRAJ),
        Case::table(
            "missing column",
            drop_col(&b, "reward"),
            TRAJ,
            &["in.parquet", "`reward`", "missing"],
        ),
        // (numbers of any width are read where they fit: text is not a number)
        Case::table(
            "wrong column type",
            replace(&b, "reward", Arc::new(StringArray::from(vec!["0.0"; 8]))),
            TRAJ,
            &["in.parquet", "`reward`", "Utf8"],
        ),
        Case::table(
            "null reward",
            null_at(&b, "reward", 2),
            TRAJ,
            &["in.parquet", "row 2", "`reward`"],
        ),
        Case::table(
            "NaN reward",
            set_f32(&b, "reward", 3, f32::NAN),
            TRAJ,
            &["in.parquet", "row 3", "`reward`", "NaN"],
        ),
        Case::table(
            "infinite reward",
            set_f32(&b, "reward", 3, f32::NEG_INFINITY),
            TRAJ,
            &["in.parquet", "row 3", "`reward`", "inf"],
        ),
        Case::table(
            "null response_ids",
            null_at(&b, "response_ids", 2),
            TRAJ,
            &["in.parquet", "row 2", "`response_ids`"],
        ),
        Case::table(
            "span out of range",
            set_span(&b, "answer_span", a0, (1, 999)),
            TRAJ,
            &["in.parquet", &format!("row {a0}"), "`answer_span`"],
        ),
    ]);
    cases.extend(trajectory_cases(&b));
    cases.extend(folder_cases(&gd.scored, TRAJ, true));
    check_stage(
        &Stage {
            name: "advantage",
            golden: gd.scored.clone(),
            model: false,
            argv: |i, _, o| s(&["advantage", "--input", i, "-o", o]),
            out: "train.parquet",
            control: true,
        },
        cases,
    );
}

/// Token-id defects of `col` at `row` (outside the vocabulary, negative).
fn id_cases(b: &RecordBatch, col: &str, row: usize) -> Vec<Case> {
    let r = format!("row {row}");
    let c = format!("`{col}`");
    vec![
        Case::table(
            &format!("{col}: token id outside the vocabulary"),
            edit_ids(b, col, row, |v| v[0] = 5000),
            TRAJ,
            &["in.parquet", &r, &c, "5000"],
        ),
        Case::table(
            &format!("{col}: negative token id"),
            edit_ids(b, col, row, |v| v[0] = -3),
            TRAJ,
            &["in.parquet", &r, &c, "-3"],
        ),
    ]
}

/// `context_ids` of `row` made longer than the model's 2048 positions.
fn too_long(b: &RecordBatch, row: usize) -> Case {
    Case::table(
        "context longer than the model's",
        edit_ids(b, "context_ids", row, |v| {
            v.splice(0..0, long_ids(2100));
        }),
        TRAJ,
        &["in.parquet", &format!("row {row}"), "2048"],
    )
}

/// The cases of a stage that reads the token columns of a scored table (`logprobs`, `values`):
/// file, folder and trajectory defects, token ids out of range, a context too long.
fn token_stage_cases() -> Vec<Case> {
    let gd = golden();
    let b = g(&gd.scored);
    let mut cases = file_cases(&gd.scored);
    cases.extend([
        zero_rows(&gd.scored, TRAJ),
        Case::table(
            "missing column",
            drop_col(&b, "context_ids"),
            TRAJ,
            &["in.parquet", "`context_ids`", "missing"],
        ),
        Case::table(
            "wrong column type",
            replace(
                &b,
                "response_ids",
                Arc::new(StringArray::from(vec!["1 2"; 8])),
            ),
            TRAJ,
            &["in.parquet", "`response_ids`", "Utf8"],
        ),
        Case::table(
            "null context_ids",
            null_at(&b, "context_ids", 1),
            TRAJ,
            &["in.parquet", "row 1", "`context_ids`"],
        ),
        too_long(&b, 3),
    ]);
    cases.extend(trajectory_cases(&b));
    cases.extend(id_cases(&b, "response_ids", 3));
    cases.extend(id_cases(&b, "context_ids", 2));
    cases.extend(folder_cases(&gd.scored, TRAJ, true));
    cases
}

#[test]
fn logprobs() {
    let mut cases = token_stage_cases();
    cases.extend(model_cases());
    check_stage(
        &Stage {
            name: "logprobs",
            golden: golden().scored.clone(),
            model: true,
            argv: |i, m, o| s(&["logprobs", "--model", m, "--input", i, "-o", o]),
            out: "with-logprobs.parquet",
            control: true,
        },
        cases,
    );
}

/// `values` validates its input like every other stage (the three bad tables above).
#[test]
fn values() {
    check_stage(
        &Stage {
            name: "values",
            golden: golden().scored.clone(),
            model: true,
            // a policy folder is a critic with a zero value head
            argv: |i, m, o| s(&["values", "--critic", m, "--input", i, "-o", o]),
            out: "valued.parquet",
            control: true,
        },
        token_stage_cases(),
    );
}

#[test]
fn update() {
    let gd = golden();
    let b = g(&gd.train);
    let mut cases = file_cases(&gd.train);
    cases.extend([
        zero_rows(&gd.train, TRAJ),
        Case::table(
            "missing column",
            drop_col(&b, "token_advantages"),
            TRAJ,
            &["in.parquet", "`token_advantages`", "missing"],
        ),
        Case::table(
            "wrong column type",
            replace(
                &b,
                "loss_mask",
                cols::build_list_i32(
                    lists_f32(&b, "token_advantages")
                        .iter()
                        .map(|v| vec![1; v.len()]),
                ),
            ),
            TRAJ,
            &["in.parquet", "`loss_mask`"],
        ),
        Case::table(
            "null response_ids",
            null_at(&b, "response_ids", 1),
            TRAJ,
            &["in.parquet", "row 1", "`response_ids`"],
        ),
        Case::table(
            "list length mismatch (token_advantages)",
            edit_f32s(&b, "token_advantages", 1, |v| {
                v.pop();
            }),
            TRAJ,
            &["in.parquet", "row 1", "`token_advantages`"],
        ),
        Case::table(
            "list length mismatch (response_logprobs)",
            edit_f32s(&b, "response_logprobs", 2, |v| v.push(-1.0)),
            TRAJ,
            &["in.parquet", "row 2", "`response_logprobs`"],
        ),
        Case::table(
            "NaN advantage",
            edit_f32s(&b, "token_advantages", 1, |v| v[0] = f32::NAN),
            TRAJ,
            &["in.parquet", "row 1", "`token_advantages`", "NaN"],
        ),
        Case::table(
            "infinite log-prob",
            edit_f32s(&b, "response_logprobs", 1, |v| v[0] = f32::NEG_INFINITY),
            TRAJ,
            &["in.parquet", "row 1", "`response_logprobs`", "inf"],
        ),
        Case::table(
            "positive log-prob",
            edit_f32s(&b, "response_logprobs", 1, |v| v[0] = 0.5),
            TRAJ,
            &["in.parquet", "row 1", "`response_logprobs`", "0.5"],
        ),
        Case::table(
            "unknown sample_type",
            set_str(&b, "sample_type", 1, "bogus"),
            TRAJ,
            &["in.parquet", "row 1", "`sample_type`", "bogus"],
        ),
        too_long(&b, 3),
    ]);
    cases.extend(trajectory_cases(&b));
    cases.extend(id_cases(&b, "response_ids", 3));
    cases.extend(id_cases(&b, "context_ids", 2));
    cases.extend(model_cases());
    check_stage(
        &Stage {
            name: "update",
            golden: gd.train.clone(),
            model: true,
            argv: |i, m, o| s(&["update", "--model", m, "--input", i, "-o", o]),
            out: "ckpt",
            control: true,
        },
        cases,
    );
}

#[test]
fn sft() {
    let gd = golden();
    let b = g(&gd.sft);
    let p = "rlcr.prompts";
    let t = g(&gd.scored);
    let mut cases = file_cases(&gd.sft);
    let mut trajectory = vec![too_long(&t, 1)];
    trajectory.extend(id_cases(&t, "response_ids", 1));
    trajectory.extend(id_cases(&t, "context_ids", 1));
    for c in &mut trajectory {
        c.label = format!("trajectory table: {}", c.label);
    }
    cases.extend([
        zero_rows(&gd.sft, p),
        Case::table(
            "missing column",
            drop_col(&b, "messages"),
            p,
            &["in.parquet", "`messages`"],
        ),
        Case::table(
            "wrong column type",
            replace(
                &b,
                "messages",
                Arc::new(Int32Array::from(vec![1; b.num_rows()])),
            ),
            p,
            &["in.parquet", "`messages`"],
        ),
        Case::table(
            "null messages",
            null_at(&b, "messages", 1),
            p,
            &["in.parquet", "row 1", "`messages`"],
        ),
        Case::table(
            "messages not JSON",
            set_str(&b, "messages", 1, "[{"),
            p,
            &["in.parquet", "row 1", "`messages`"],
        ),
        Case::table(
            "messages without an assistant turn",
            set_str(
                &b,
                "messages",
                1,
                "[{\"role\": \"user\", \"content\": \"hi\"}]",
            ),
            p,
            &["in.parquet", "row 1", "`messages`", "assistant"],
        ),
    ]);
    cases.extend(trajectory);
    cases.extend(model_cases());
    check_stage(
        &Stage {
            name: "sft",
            golden: gd.sft.clone(),
            model: true,
            argv: |i, m, o| s(&["sft", "--model", m, "--input", i, "-o", o]),
            out: "ckpt",
            control: true,
        },
        cases,
    );
}

#[test]
fn probe() {
    let gd = golden();
    let b = g(&gd.scored);
    let a0 = row_of(&b, "answer", 0);
    let mut cases = file_cases(&gd.scored);
    cases.extend([
        zero_rows(&gd.scored, TRAJ),
        Case::table(
            "missing column",
            drop_col(&b, "acc_reward"),
            TRAJ,
            &["in.parquet", "`acc_reward`", "missing"],
        ),
        // (numbers of any width are read where they fit: text is not a number)
        Case::table(
            "wrong column type",
            replace(
                &b,
                "acc_reward",
                Arc::new(StringArray::from(vec!["0.0"; 8])),
            ),
            TRAJ,
            &["in.parquet", "`acc_reward`", "Utf8"],
        ),
        Case::table(
            "null acc_reward",
            null_at(&b, "acc_reward", a0),
            TRAJ,
            &["in.parquet", &format!("row {a0}"), "`acc_reward`"],
        ),
        Case::table(
            "NaN acc_reward",
            set_f32(&b, "acc_reward", a0, f32::NAN),
            TRAJ,
            &["in.parquet", &format!("row {a0}"), "`acc_reward`", "NaN"],
        ),
        Case::table(
            "NaN confidence",
            set_f32(&b, "confidence", row_of(&b, "confidence", 0), f32::NAN),
            TRAJ,
            &[
                "in.parquet",
                &format!("row {}", row_of(&b, "confidence", 0)),
                "`confidence`",
                "NaN",
            ],
        ),
        too_long(&b, a0),
    ]);
    cases.extend(trajectory_cases(&b));
    cases.extend(id_cases(&b, "response_ids", a0));
    cases.extend(id_cases(&b, "context_ids", a0));
    cases.extend(model_cases());
    cases.extend(folder_cases(&gd.scored, TRAJ, true));
    check_stage(
        &Stage {
            name: "probe",
            golden: gd.scored.clone(),
            model: true,
            argv: |i, m, o| {
                s(&[
                    "probe",
                    "--model",
                    m,
                    "--input",
                    i,
                    "-o",
                    o,
                    "--samples",
                    "1",
                    "--cuts",
                    "1",
                    "--max-new-tokens",
                    "2",
                ])
            },
            out: "probe.parquet",
            control: true,
        },
        cases,
    );
}

#[test]
fn report() {
    let gd = golden();
    let b = g(&gd.scored);
    let c0 = row_of(&b, "confidence", 0);
    let mut cases = file_cases(&gd.scored);
    cases.extend([
        zero_rows(&gd.scored, TRAJ).ok(),
        // An unscored table has no acc_reward: report describes what there is (by design).
        Case::table(
            "no acc_reward column",
            drop_col(&b, "acc_reward"),
            TRAJ,
            &[],
        )
        .ok(),
        // Numbers of any width are read (float64 from pandas); text is not a number.
        Case::table(
            "float64 confidence",
            replace(&b, "confidence", Arc::new(Float64Array::from(vec![0.5; 8]))),
            TRAJ,
            &[],
        )
        .ok(),
        Case::table(
            "wrong column type",
            replace(
                &b,
                "confidence",
                Arc::new(StringArray::from(vec!["0.5"; 8])),
            ),
            TRAJ,
            &["in.parquet", "`confidence`", "Utf8"],
        ),
        Case::table(
            "NaN confidence",
            set_f32(&b, "confidence", c0, f32::NAN),
            TRAJ,
            &["in.parquet", &format!("row {c0}"), "`confidence`", "NaN"],
        ),
        Case::table(
            "NaN acc_reward",
            set_f32(&b, "acc_reward", 0, f32::NAN),
            TRAJ,
            &["in.parquet", "row 0", "`acc_reward`", "NaN"],
        ),
        Case::table(
            "null acc_reward",
            null_at(&b, "acc_reward", 0),
            TRAJ,
            &["in.parquet", "row 0", "`acc_reward`"],
        ),
    ]);
    cases.extend(trajectory_cases(&b));
    cases.extend(folder_cases(&gd.scored, TRAJ, true));
    check_stage(
        &Stage {
            name: "report",
            golden: gd.scored.clone(),
            model: false,
            argv: |i, _, o| s(&["report", "--input", i, "-o", o, "--examples", "1"]),
            out: "report",
            control: true,
        },
        cases,
    );
    // The probe table (--probe); the golden scored table stays the --input.
    let pb = g(&gd.probe);
    let pr = "rlcr.probe";
    let mut cases = file_cases(&gd.probe);
    cases.extend([
        Case::table(
            "missing column",
            drop_col(&pb, "num_correct"),
            pr,
            &["in.parquet", "`num_correct`"],
        ),
        Case::table(
            "NaN probe_confidence",
            set_f32(&pb, "probe_confidence", 1, f32::NAN),
            pr,
            &["in.parquet", "row 1", "`probe_confidence`", "NaN"],
        ),
        Case::table(
            "null cut_fraction",
            null_at(&pb, "cut_fraction", 1),
            pr,
            &["in.parquet", "row 1", "`cut_fraction`"],
        ),
    ]);
    check_stage(
        &Stage {
            name: "report --probe",
            golden: gd.probe.clone(),
            model: false,
            argv: |i, _, o| {
                let scored = golden().scored.display().to_string();
                s(&[
                    "report",
                    "--input",
                    &scored,
                    "--probe",
                    i,
                    "-o",
                    o,
                    "--examples",
                    "1",
                ])
            },
            out: "report",
            control: true,
        },
        cases,
    );
}

#[test]
fn prepare() {
    let gd = golden();
    let b = g(&gd.countdown);
    let mut cases = file_cases(&gd.countdown);
    // `--from countdown` reads JSON lines unless the file starts with PAR1.
    cases[0].needles = vec!["in.parquet".into(), "line 1".into()];
    cases[1].needles = vec!["in.parquet".into(), "no rows".into()];
    cases.extend([
        zero_rows(&gd.countdown, "test"),
        Case::table(
            "missing column",
            drop_col(&b, "nums"),
            "test",
            &["in.parquet", "`nums`", "missing"],
        ),
        Case::table(
            "wrong column type",
            replace(
                &b,
                "target",
                Arc::new(StringArray::from(vec!["7", "12", "5"])),
            ),
            "test",
            &["in.parquet", "row 0", "`target`"],
        ),
        Case::table(
            "null target",
            null_at(&b, "target", 1),
            "test",
            &["in.parquet", "row 1", "`target`"],
        ),
    ]);
    check_stage(
        &Stage {
            name: "prepare --from countdown",
            golden: gd.countdown.clone(),
            model: false,
            argv: |i, _, o| s(&["prepare", "--from", "countdown", "--input", i, "-o", o]),
            out: "prompts.parquet",
            control: true,
        },
        cases,
    );
    let v = g(&gd.verl);
    let mut cases = file_cases(&gd.verl);
    cases.extend([
        zero_rows(&gd.verl, "test"),
        Case::table(
            "missing column",
            drop_col(&v, "prompt"),
            "test",
            &["in.parquet", "`prompt`", "missing"],
        ),
        Case::table(
            "null prompt",
            null_at(&v, "prompt", 1),
            "test",
            &["in.parquet", "row 1", "`prompt`"],
        ),
        Case::table(
            "null reward_model",
            null_at(&v, "reward_model", 1),
            "test",
            &["in.parquet", "row 1", "`reward_model"],
        ),
    ]);
    check_stage(
        &Stage {
            name: "prepare --from verl",
            golden: gd.verl.clone(),
            model: false,
            argv: |i, _, o| s(&["prepare", "--from", "verl", "--input", i, "-o", o]),
            out: "prompts.parquet",
            control: true,
        },
        cases,
    );
}

#[test]
fn inspect() {
    let gd = golden();
    let mut cases = file_cases(&gd.scored);
    cases.push(zero_rows(&gd.scored, TRAJ).ok());
    check_stage(
        &Stage {
            name: "inspect",
            golden: gd.scored.clone(),
            model: false,
            argv: |i, _, _| s(&["inspect", i]),
            out: "nothing",
            control: true,
        },
        cases,
    );
}

#[test]
fn import_gguf() {
    // The GGUF reader's own defects (truncation, corrupt bytes) are tested in gguf.rs; here the
    // file-level ones every input reader must survive.
    let mut cases = vec![
        Case::bytes("empty file", vec![], &["in.parquet"]),
        Case::bytes(
            "not GGUF",
            b"GGUF is not this\n".repeat(10),
            &["in.parquet", "GGUF"],
        ),
        Case::bytes(
            "GGUF magic, then nothing",
            b"GGUF\x03\x00\x00\x00".to_vec(),
            &["in.parquet"],
        ),
    ];
    cases.push(Case::new("no such file", &["in.parquet"]));
    // (the last case's input is missing: the golden path below does not exist)
    check_stage(
        &Stage {
            name: "import-gguf",
            golden: PathBuf::from("in.parquet"),
            model: false,
            argv: |i, _, o| s(&["import-gguf", "--input", i, "-o", o]),
            out: "model",
            control: false,
        },
        cases,
    );
}
