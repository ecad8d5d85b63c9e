//! Every input the fuzzers found a bug with (`fixtures/fuzz/<target>/`), and the seed corpus
//! (`fuzz/corpus/<target>/seed-*`), run through the same checks as the fuzz targets: the harness
//! in `fuzz/harness.rs` is compiled into this test too, so a crash the fuzzers found stays fixed.
//! The fuzz crate itself (`fuzz/`, cargo-fuzz, nightly) is never built by the normal test suite.
//!
//! `write_fuzz_seed_corpus` (ignored) regenerates the seed corpus:
//! `cargo test --test integration write_fuzz_seed_corpus -- --ignored`.
use std::path::{Path, PathBuf};

#[path = "../../fuzz/harness.rs"]
mod harness;

use crate::determinism::{model, prompts, tiny_gguf};
use crate::support::pipeline;
use crate::{fixtures, Workdir};

type Target = fn(&[u8]);

const TARGETS: [(&str, Target); 4] = [
    ("countdown", harness::countdown),
    ("parsers", harness::parsers),
    ("gguf", harness::gguf),
    ("parquet", harness::parquet),
];

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target)
}

/// Files of `dir` whose name starts with `prefix`, sorted.
fn inputs(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.is_file()
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
        })
        .collect();
    v.sort();
    v
}

#[test]
fn saved_fuzz_inputs_pass_the_fuzz_checks() {
    let mut failures = Vec::new();
    let mut count = 0;
    for (name, f) in TARGETS {
        let mut files = inputs(&fixtures().join("fuzz").join(name), "");
        let seeds = inputs(&corpus_dir(name), "seed-");
        assert!(!seeds.is_empty(), "no seed corpus for {name}");
        files.extend(seeds);
        for p in files {
            let data = std::fs::read(&p).unwrap();
            count += 1;
            if std::panic::catch_unwind(|| f(&data)).is_err() {
                failures.push(format!("{name}: {}", p.display()));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "inputs that panic:\n{}",
        failures.join("\n")
    );
    assert!(count >= 8, "{count} inputs");
}

/// Regenerate `fuzz/corpus/*/seed-*` (small valid inputs of each kind for the fuzzers to mutate).
#[test]
#[ignore]
fn write_fuzz_seed_corpus() {
    let write = |target: &str, name: &str, bytes: &[u8]| {
        let d = corpus_dir(target);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(format!("seed-{name}")), bytes).unwrap();
    };
    // countdown: ground truth line + response
    let task = r#"{"target": 24, "numbers": [3, 8, 4, 2]}"#;
    write(
        "countdown",
        "answer",
        format!("{task}\n<think>x</think>\n<answer>(8 - 4) * 3 * 2</answer>").as_bytes(),
    );
    write(
        "countdown",
        "unicode",
        format!("{task}\n<answer>(8 − 4) × 3 ÷ (2 / 4)</answer>").as_bytes(),
    );
    write(
        "countdown",
        "tinyzero",
        b"{\"target\": 132, \"numbers\": [7, 77, 48]}\nUser: [7, 77, 48] 132 Assistant: Let me solve this step by step.\n<think>reasoning</think>\n<answer>(48+7) + 77</answer>",
    );
    write(
        "countdown",
        "float-target",
        b"{\"target\": -35.10714285714286, \"numbers\": [15, 50, 56, 51]}\nAssistant: <answer>(50 / 56 + 15-51)</answer>",
    );
    write(
        "countdown",
        "pyexpr",
        b"\n(-8)**(1/3) + 2**3**2 // 7 - 10**309/10",
    );
    // parsers: selector byte, ground truth line, response
    let sel = |k: u8, text: &str| [&[k][..], text.as_bytes()].concat();
    write(
        "parsers",
        "countdown",
        &sel(
            0,
            &format!("{task}\n<think>a</think>\n<answer>(8-4)*3*2</answer>"),
        ),
    );
    write(
        "parsers",
        "math",
        &sel(
            3,
            "19\n<think>t</think><answer>\\boxed{19}</answer><analysis>a</analysis><confidence>0.8</confidence>",
        ),
    );
    write(
        "parsers",
        "exact",
        &sel(4, "[\"Paris\"]\n<think>t</think><answer>the Paris</answer>"),
    );
    write(
        "parsers",
        "f1",
        &sel(6, "[\"New York City\"]\n<answer>new york</answer>"),
    );
    write(
        "parsers",
        "choice",
        &sel(8, "[\"B\"]\n<answer>(B) two</answer>"),
    );
    write(
        "parsers",
        "confidence",
        &sel(1, "\n<analysis>unsure</analysis> <confidence> 8.5e-1 </confidence><confidence>80%</confidence>"),
    );
    // gguf: a whole tiny model, and a few tensors of every supported type
    write("gguf", "model.gguf", &tiny_gguf());
    write("gguf", "types.gguf", &types_gguf());
    // parquet: a prompts table, an answers table, a scored table
    let wd = Workdir::new();
    prompts(&wd, 1);
    let m = model("tiny-qwen2");
    let answers = pipeline::answers_args(
        &m,
        "prompts.parquet",
        "answers.parquet",
        1,
        3,
        &["--system-prompt", ""],
    );
    pipeline::run(&wd, &answers);
    wd.run(&[
        "score",
        "--input",
        "answers.parquet",
        "-o",
        "scored.parquet",
    ]);
    for t in ["prompts", "answers", "scored"] {
        write(
            "parquet",
            &format!("{t}.parquet"),
            &std::fs::read(wd.path(&format!("{t}.parquet"))).unwrap(),
        );
    }
}

/// A GGUF file with one small tensor of each supported type (not a whole model).
fn types_gguf() -> Vec<u8> {
    use rlcr::model::gguf::writer::{f32_bytes, s, Writer};
    use rlcr::model::gguf::Value;
    let mut w = Writer::default();
    w.kv("general.architecture", s("llama"))
        .kv("llama.block_count", Value::U32(1))
        .kv("general.alignment", Value::U32(32));
    w.tensor(
        "output_norm.weight",
        &[4],
        0,
        f32_bytes(&[1.0, -2.0, 0.5, 3.0]),
    );
    w.tensor("f16", &[2], 1, vec![0x00, 0x3c, 0x00, 0xc0]);
    w.tensor("bf16", &[2], 30, vec![0x80, 0x3f, 0x00, 0xc0]);
    let mut q8 = vec![0x00, 0x38]; // d = 0.5
    q8.extend((0..32).map(|i| (i as i8 - 16) as u8));
    w.tensor("q8_0", &[32], 8, q8);
    let mut q4 = vec![0x00, 0x40]; // d = 2
    q4.extend([0x1f; 16]);
    w.tensor("q4_0", &[32], 2, q4);
    let mut q41 = vec![0x00, 0x34, 0x00, 0xbc]; // d = 0.25, m = -1
    q41.extend([0xa3; 16]);
    w.tensor("q4_1", &[32], 3, q41);
    w.to_bytes()
}
