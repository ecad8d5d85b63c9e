//! `--shard I/N` on generate-confidence, logprobs, score and probe: the union of the N shard
//! outputs holds exactly the rows of the unsharded output with the same values (compared after
//! sorting by `sample_id`, since the parts are concatenated in shard order), every shard keeps
//! whole prompts, the output records the shard, and a folder of shard parts feeds the next stage
//! as one table. (generate-answers: `sample::shards_split_prompts_and_add_up_to_the_whole_run`.)
use std::collections::BTreeSet;
use std::path::Path;

use arrow::array::RecordBatch;
use arrow::compute::{lexsort_to_indices, take_record_batch, SortColumn};
use rlcr::table::{cols, Reader, Shard};

use crate::determinism::{answers_args, close_thinking, confidence_args, kv, model, prompts, read};
use crate::Workdir;

const N: u32 = 3;

/// `b` sorted by `keys` (ascending).
fn sorted(b: &RecordBatch, keys: &[&str]) -> RecordBatch {
    let cols: Vec<SortColumn> = keys
        .iter()
        .map(|k| SortColumn {
            values: b.column_by_name(k).unwrap().clone(),
            options: None,
        })
        .collect();
    let idx = lexsort_to_indices(&cols, None).unwrap();
    take_record_batch(b, &idx).unwrap()
}

/// All rows of the tables `paths`, in order, as one batch.
fn read_all(paths: &[String], wd: &Workdir) -> RecordBatch {
    let batches: Vec<RecordBatch> = paths.iter().map(|p| read(&wd.path(p))).collect();
    arrow::compute::concat_batches(&batches[0].schema(), &batches).unwrap()
}

fn prompt_ids(b: &RecordBatch) -> BTreeSet<String> {
    crate::support::table::strs(b, "prompt_id")
        .into_iter()
        .collect()
}

/// Run `args(shard, out)` for every shard `i/N` into `dir/part-i.parquet`; check that each part
/// holds only its shard's prompts and records the shard; return the part paths.
fn run_shards(wd: &Workdir, dir: &str, args: &dyn Fn(&str, &str) -> Vec<String>) -> Vec<String> {
    let mut parts = Vec::new();
    for i in 0..N {
        let shard = format!("{i}/{N}");
        let out = format!("{dir}/part-{i}.parquet");
        let a = args(&shard, &out);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        wd.run(&a);
        let b = read(&wd.path(&out));
        let s: Shard = shard.parse().unwrap();
        for p in prompt_ids(&b) {
            assert!(s.contains(&p), "{out}: prompt {p} is not in shard {shard}");
        }
        let config: serde_json::Value =
            serde_json::from_str(&kv(&wd.path(&out))["rlcr.config"]).unwrap();
        assert_eq!(
            config["shard"],
            serde_json::json!({"index": i, "count": N}),
            "{out}: the shard is recorded"
        );
        parts.push(out);
    }
    parts
}

/// The union of the parts equals the whole table (rows and values), sorted by `keys`.
fn assert_union(wd: &Workdir, whole: &str, parts: &[String], keys: &[&str]) {
    let w = read(&wd.path(whole));
    let u = read_all(parts, wd);
    assert_eq!(
        u.num_rows(),
        w.num_rows(),
        "{whole}: row count of the union"
    );
    assert!(
        sorted(&u, keys) == sorted(&w, keys),
        "{whole}: the union of the shards differs from the unsharded output"
    );
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// The model stages and score, sharded 3 ways, add up to their unsharded runs; the folder of
/// score parts feeds `advantage` and `probe` as one table.
#[test]
fn shards_of_every_sharded_stage_add_up_to_the_whole() {
    let wd = Workdir::new();
    prompts(&wd, 9);
    let m = model("tiny-qwen2");
    let a = answers_args(&m, "answers.parquet", "16");
    wd.run(&a);
    close_thinking(&wd, &m, "answers.parquet", "closed.parquet");
    // every shard holds some prompts (else this test would prove little)
    let all_prompts = prompt_ids(&read(&wd.path("closed.parquet")));
    for i in 0..N {
        let s = Shard { index: i, count: N };
        assert!(all_prompts.iter().any(|p| s.contains(p)), "shard {i} empty");
    }

    // generate-confidence
    wd.run(&confidence_args(&m, "closed.parquet", "traj.parquet", "16"));
    let conf = |shard: &str, out: &str| {
        let mut v = strings(&confidence_args(&m, "closed.parquet", out, "4"));
        v.extend(strings(&["--shard", shard]));
        v
    };
    let parts = run_shards(&wd, "traj", &conf);
    assert_union(&wd, "traj.parquet", &parts, &["sample_id"]);

    // score, from the whole trajectory
    wd.run(&["score", "--input", "traj.parquet", "-o", "scored.parquet"]);
    let score = |shard: &str, out: &str| {
        strings(&[
            "score",
            "--input",
            "traj.parquet",
            "-o",
            out,
            "--shard",
            shard,
        ])
    };
    let parts = run_shards(&wd, "scored", &score);
    assert_union(&wd, "scored.parquet", &parts, &["sample_id"]);
    let acc = cols::f32_col(&read(&wd.path("scored.parquet")), "s", "acc_reward")
        .unwrap()
        .iter()
        .flatten()
        .filter(|&a| a == 1.0)
        .count();
    assert!(acc > 0, "some answers are correct");
    // no temp file is left beside the parts
    let names: Vec<String> = std::fs::read_dir(wd.path("scored"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(names.len(), N as usize, "{names:?}");

    // the folder of score parts is one table for the next stage
    assert_eq!(
        Reader::open(&wd.path("scored")).unwrap().num_rows(),
        read(&wd.path("scored.parquet")).num_rows()
    );
    wd.run(&[
        "advantage",
        "--input",
        "scored.parquet",
        "-o",
        "train.parquet",
    ]);
    wd.run(&[
        "advantage",
        "--input",
        "scored",
        "-o",
        "train-parts.parquet",
    ]);
    assert_union(
        &wd,
        "train.parquet",
        &["train-parts.parquet".to_string()],
        &["sample_id"],
    );

    // logprobs
    let lp = |shard: Option<&str>, out: &str| {
        let mut v = strings(&[
            "logprobs",
            "--model",
            &m,
            "--input",
            "train.parquet",
            "-o",
            out,
            "--column",
            "ref_logprobs",
            "--batch-size",
            "3",
        ]);
        if let Some(s) = shard {
            v.extend(strings(&["--shard", s]));
        }
        v
    };
    let whole = lp(None, "ref.parquet");
    wd.run(&whole.iter().map(String::as_str).collect::<Vec<_>>());
    let parts = run_shards(&wd, "ref", &|s, o| lp(Some(s), o));
    assert_union(&wd, "ref.parquet", &parts, &["sample_id"]);

    // probe, reading the folder of score parts
    let probe = |shard: Option<&str>, input: &str, out: &str| {
        let mut v = strings(&[
            "--seed",
            "4",
            "probe",
            "--model",
            &m,
            "--input",
            input,
            "-o",
            out,
            "--cut-fractions",
            "0,1",
            "--samples",
            "3",
            "--max-new-tokens",
            "4",
        ]);
        if let Some(s) = shard {
            v.extend(strings(&["--shard", s]));
        }
        v
    };
    let whole = probe(None, "scored.parquet", "probe.parquet");
    wd.run(&whole.iter().map(String::as_str).collect::<Vec<_>>());
    let parts = run_shards(&wd, "probe", &|s, o| probe(Some(s), "scored", o));
    assert_union(&wd, "probe.parquet", &parts, &["sample_id", "cut_index"]);
}

/// Bad `--shard` values are usage errors (exit 2) and write nothing; a shard needs `prompt_id`.
#[test]
fn shard_flag_errors() {
    let wd = Workdir::new();
    prompts(&wd, 2);
    for bad in ["3/3", "x/2", "1", "0/0"] {
        let e = wd.fail(
            &[
                "score",
                "--input",
                "prompts.parquet",
                "-o",
                "s.parquet",
                "--shard",
                bad,
            ],
            2,
        );
        assert!(e.contains("--shard"), "{e}");
    }
    let m = model("tiny-qwen2");
    wd.fail(
        &[
            "logprobs",
            "--model",
            &m,
            "--input",
            "prompts.parquet",
            "-o",
            "l.parquet",
            "--shard",
            "1/x",
        ],
        2,
    );
    // The sampling stages take the same typed flag: a usage error too.
    for stage in ["generate-answers", "generate-confidence"] {
        let e = wd.fail(
            &[
                stage,
                "--model",
                &m,
                "--input",
                "prompts.parquet",
                "-o",
                "g.parquet",
                "--shard",
                "2/2",
            ],
            2,
        );
        assert!(e.contains("--shard"), "{stage}: {e}");
    }
    assert!(!wd.path("g.parquet").exists());
    assert!(!wd.path("s.parquet").exists() && !wd.path("l.parquet").exists());
    assert!(Path::new(&wd.path("prompts.parquet")).exists());
}
