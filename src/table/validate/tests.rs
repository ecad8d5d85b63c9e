//! Tests of the validator: schema checks, row rules, cross-row rules and the identity digests.
//!
//! A test-only file: its parent declares it `#[cfg(test)] mod tests;`.
use super::ids::*;
use super::*;
use crate::table::cols::*;
use crate::table::schema::TRAJECTORY;
use arrow::array::{ArrayRef, Float32Array, Int32Array, StringArray};
use arrow::datatypes::{DataType, Field};
use std::sync::Arc;

fn table(types: &[&str], ids: &[&str], aidx: &[i32], lp_lens: &[usize]) -> RecordBatch {
    let n = types.len();
    let schema = Arc::new(Schema::new(vec![
        Field::new("prompt_id", DataType::Utf8, false),
        Field::new("sample_type", DataType::Utf8, false),
        Field::new("answer_idx", DataType::Int32, false),
        Field::new("sample_id", DataType::Utf8, false),
        Field::new(
            "response_ids",
            crate::table::schema::ColType::ListInt32.arrow(),
            false,
        ),
        Field::new(
            "response_logprobs",
            crate::table::schema::ColType::ListFloat32.arrow(),
            false,
        ),
        Field::new("reward", DataType::Float32, false),
    ]));
    let cols: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(vec!["p"; n])),
        Arc::new(StringArray::from(types.to_vec())),
        Arc::new(Int32Array::from(aidx.to_vec())),
        Arc::new(StringArray::from(ids.to_vec())),
        build_list_i32((0..n).map(|_| vec![1, 2, 3])),
        build_list_f32(lp_lens.iter().map(|&l| vec![-0.5f32; l])),
        Arc::new(Float32Array::from(vec![1.0; n])),
    ];
    RecordBatch::try_new(schema, cols).unwrap()
}

/// The per-prompt digest table: repeats found in a prompt of any size (the table grows past
/// its 64 first slots; digests sharing their high bits probe on), nothing carried from one
/// prompt to the next, and the generation count's wrap empties the table.
#[test]
fn prompt_ids_find_repeats_within_a_prompt_only() {
    let mut t = PromptIds::default();
    t.enter(0);
    // the same high 64 bits: one long probe chain
    for k in 0..1000u128 {
        assert!(t.insert(k), "{k}");
    }
    assert!(t.slots.len() >= 2000 && t.slots.len().is_power_of_two());
    for k in [0u128, 1, 499, 999] {
        assert!(!t.insert(k), "{k} is a repeat");
    }
    assert!(t.insert(1000));
    t.enter(0); // still prompt 0: its digests stay
    assert!(!t.insert(7));
    t.enter(1);
    assert!(t.insert(7) && !t.insert(7));
    assert!(t.insert(5u128 << 64 | 3) && t.insert(6u128 << 64 | 3));
    t.enter(0); // a new run of prompt 0 (the table's rows are not grouped): empty again
    assert!(t.insert(999) && t.insert(7));
    t.generation = u32::MAX;
    t.prompt = Some(9);
    assert!(t.insert(42));
    t.enter(3);
    assert_eq!(t.generation, 1);
    assert!(t.slots.iter().all(|&s| s == (0, 0)));
    assert!(t.insert(42) && t.insert(999) && !t.insert(42));

    // through the validator: 200 answers of one prompt, the last repeating row 3's id
    let types = vec!["answer"; 200];
    let mut ids: Vec<String> = (0..200).map(|i| format!("p/a{i}")).collect();
    let aidx: Vec<i32> = (0..200).collect();
    fn refs(ids: &[String]) -> Vec<&str> {
        ids.iter().map(String::as_str).collect()
    }
    check(&table(&types, &refs(&ids), &aidx, &[3; 200])).unwrap();
    ids[199] = "p/a3".into();
    let e = check(&table(&types, &refs(&ids), &aidx, &[3; 200]))
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "t.parquet, row 199, column `sample_id`: duplicate sample_id \"p/a3\""
    );
}

fn check(b: &RecordBatch) -> Result<()> {
    check_with(b, &["sample_id"])
}

/// Validate `b` as the one batch of `t.parquet`, with the `required` columns.
fn check_with(b: &RecordBatch, required: &[&str]) -> Result<()> {
    validate_batches(
        "t.parquet",
        &TRAJECTORY,
        required,
        std::slice::from_ref(b),
        &b.schema(),
    )
}

#[test]
fn answers_by_prompt_runs_and_wide_indices() {
    let mut a = AnswerSet::default();
    let p = a.prompt(b"p");
    assert_eq!(a.prompt(b"p"), p);
    let q = a.prompt(b"q");
    assert_ne!(p, q);
    // Back to a prompt seen before (not adjacent): the same number.
    assert_eq!(a.prompt(b"p"), p);
    for idx in [0, 63, 64, -1, 1000] {
        assert!(!a.contains(p, idx));
        assert!(a.insert(p, idx), "{idx}");
        assert!(!a.insert(p, idx), "{idx}");
        assert!(a.contains(p, idx) && !a.contains(q, idx));
    }
}

#[test]
fn split_prompt_runs_still_find_a_second_answer() {
    let b = table(
        &["answer", "answer", "answer"],
        &["p/a0", "x", "p/a0b"],
        &[0, 0, 0],
        &[3, 3, 3],
    );
    let pid = StringArray::from(vec!["p", "q", "p"]);
    let b = RecordBatch::try_new(
        b.schema(),
        std::iter::once(Arc::new(pid) as ArrayRef)
            .chain(b.columns()[1..].iter().cloned())
            .collect(),
    )
    .unwrap();
    let e = check(&b).unwrap_err().to_string();
    assert_eq!(e, "t.parquet, row 2, column `answer_idx`: a second answer row for prompt_id \"p\", answer_idx 0");
}

#[test]
fn digests_separate_parts_and_values() {
    let d = |p: &str, a: i32| answer_key(p, a);
    assert_ne!(d("p1", 0), d("p1", 1));
    assert_ne!(d("p1", 0), d("p10", 0));
    assert_ne!(d("", 0), d("\0", 0));
    assert_ne!(h128(&[&"ab", &"c"]), h128(&[&"a", &"bc"]));
    assert_eq!(d("p", 3), d("p", 3));
    // 200k distinct ids, no collision in either half.
    let mut lo = HashSet::new();
    let mut hi = HashSet::new();
    for i in 0..200_000 {
        let h = h128(&[&format!("task-{i:08}/a{}", i % 7).as_str()]);
        assert!(lo.insert(h as u64) && hi.insert((h >> 64) as u64), "{i}");
    }
}

/// The inverse of [`short_key`]: its rounds undone in reverse order.
fn short_key_inverse(y: u128) -> u128 {
    feistel(y, (0..ROUNDS.len()).rev())
}

/// Short ids: the digest is a bijection of the packed id (so distinct ids never share one);
/// every id: the same read from bytes or from an Arrow string view (also one with bytes left
/// past the string), and spread over every bit: 300k ids, short and long, distinct in their
/// top 96 bits (what the duplicate check compares) and filling the 4096 buckets evenly.
#[test]
fn id_digests() {
    use arrow::array::StringViewArray;
    let mut x = 0x0123_4567_89AB_CDEFu128 << 64 | 0xFEDC_BA98;
    for _ in 0..10_000 {
        x = x.wrapping_mul(0x2545_F491_4F6C_DD1D_9E37_79B9_7F4A_7C15) ^ (x >> 61);
        assert_eq!(short_key_inverse(short_key(x)), x);
    }
    assert_ne!(id_key(b""), id_key(b"\0"));
    assert_ne!(id_key(b"a"), id_key(b"a\0"));
    assert_ne!(id_key(b"abcdefghijkl"), id_key(b"abcdefghijkl\0"));
    // longer ids: the length, every byte of every word and the words' order count
    let long = *b"0123456789abcdefghijklmnopqrstuv";
    assert_ne!(id_key(&long[..28]), id_key(&long[..29]));
    assert_ne!(
        id_key(&long[..28]),
        id_key(b"0123456789abcdefghijklmnopqr\0")
    );
    for k in 0..long.len() {
        let mut other = long;
        other[k] ^= 1;
        assert_ne!(id_key(&long), id_key(&other), "{k}");
    }
    let words: Vec<u8> = (0..44u8).collect();
    let mut swapped = words.clone();
    swapped[12..28].copy_from_slice(&words[28..44]);
    swapped[28..44].copy_from_slice(&words[12..28]);
    assert_ne!(id_key(&words), id_key(&swapped));
    let ids: Vec<String> = (0..40)
        .map(|l| {
            (0..l)
                .map(|k| (b'a' + (k * 7 + l) as u8 % 26) as char)
                .collect()
        })
        .chain(["p/a0", "task-00001234/a3/c1", "\u{e9}t\u{e9}/a1"].map(String::from))
        .collect();
    let views = StringViewArray::from_iter_values(&ids);
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(view_key(&views, i), id_key(id.as_bytes()), "{id:?}");
    }
    // a view of "abc" with a stray byte after the string: the same digest as "abc"
    let v = views.views()[3];
    assert_eq!(v as u32, 3);
    let dirty = v | (0x5Au128 << (32 + 8 * 5));
    // SAFETY: an inline view (length 3 <= 12) refers to no buffer; its bytes are valid UTF-8
    let dirty = unsafe {
        StringViewArray::new_unchecked(
            vec![dirty].into(),
            Vec::<arrow::buffer::Buffer>::new().into(),
            None,
        )
    };
    assert_eq!(view_key(&dirty, 0), id_key(ids[3].as_bytes()));

    let mut top = HashSet::new();
    let mut buckets = vec![0usize; 1 << ID_BUCKET_BITS];
    for i in 0..300_000u32 {
        let id = match i % 3 {
            0 => format!("cd{i:07}/a{}", i % 8),
            1 => format!("q{i}/c{}", i % 5),
            _ => format!("task-{i:08}/a{}/c{}", i % 7, i % 3),
        };
        let k = id_key(id.as_bytes());
        assert!(top.insert(k >> ROW_BITS), "{id}");
        buckets[(k >> (128 - ID_BUCKET_BITS)) as usize] += 1;
    }
    // 73 ids per bucket on average; a fair spread stays well inside 40..120
    let (lo, hi) = (buckets.iter().min().unwrap(), buckets.iter().max().unwrap());
    assert!(*lo > 40 && *hi < 120, "{lo}..{hi}");
}

/// The row rules give the same verdicts and messages whether the ids come as plain strings,
/// as dictionaries (`prompt_id`, `sample_type`) or as views (`sample_id`), as `score` reads
/// them.
#[test]
fn dictionaries_and_views_read_the_same() {
    use arrow::array::{DictionaryArray, StringViewArray};
    use arrow::datatypes::Int32Type;
    let recast = |b: &RecordBatch| {
        let mut fields = Vec::new();
        let mut cols: Vec<ArrayRef> = Vec::new();
        for (f, c) in b.schema().fields().iter().zip(b.columns()) {
            let s = c.as_any().downcast_ref::<StringArray>();
            let (dt, c): (DataType, ArrayRef) = match (f.name().as_str(), s) {
                ("prompt_id" | "sample_type", Some(s)) => {
                    let d: DictionaryArray<Int32Type> = s.iter().collect();
                    (d.data_type().clone(), Arc::new(d))
                }
                ("sample_id", Some(s)) => {
                    let v: StringViewArray = s.iter().collect();
                    (DataType::Utf8View, Arc::new(v))
                }
                _ => (f.data_type().clone(), c.clone()),
            };
            fields.push(Field::new(f.name(), dt, f.is_nullable()));
            cols.push(c);
        }
        RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).unwrap()
    };
    let run = |b: &RecordBatch| {
        let mut v = Validator::new("t.parquet", &TRAJECTORY);
        v.check_batch(b).and_then(|_| v.finish())
    };
    let long = "a-much-longer-sample-id/a0";
    let cases = [
        table(
            &["answer", "confidence", "answer", "confidence"],
            &["p/a0", "p/a0/c0", long, "p/a1/c0"],
            &[0, 0, 1, 1],
            &[3, 3, 3, 3],
        ),
        table(&["answer", "answer"], &["p/a0", "p/a0"], &[0, 1], &[3, 3]),
        table(&["answer", "answer"], &[long, long], &[0, 1], &[3, 3]),
        table(
            &["answer", "confidence"],
            &["p/a0", "p/a0"],
            &[0, 0],
            &[3, 3],
        ),
        table(&["answer", "answer"], &["p/a0", "p/a1"], &[0, 0], &[3, 3]),
        table(
            &["confidence", "answer"],
            &["p/a1/c0", "p/a1"],
            &[1, 1],
            &[3, 3],
        ),
        table(
            &["answer", "confidence"],
            &["p/a0", "p/a1/c0"],
            &[0, 1],
            &[3, 3],
        ),
    ];
    for (k, b) in cases.iter().enumerate() {
        let r = recast(b);
        assert!(matches!(r.column(0).data_type(), DataType::Dictionary(..)));
        assert_eq!(r.column(3).data_type(), &DataType::Utf8View);
        let (want, got) = (run(b), run(&r));
        match (&want, &got) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "case {k}"),
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "case {k}"),
            _ => panic!("case {k}: {want:?} vs {got:?}"),
        }
        assert_eq!(want.is_ok(), [0, 5].contains(&k), "case {k}: {want:?}");
    }
}

#[test]
fn good_table_passes() {
    let b = table(
        &["answer", "confidence"],
        &["p/a0", "p/a0/c0"],
        &[0, 0],
        &[3, 3],
    );
    check(&b).unwrap();
}

/// The hashed walk finds the repeat sorting finds: ids from small pools (many repeats),
/// all distinct, one planted repeat far apart, and digests made to share their bucket and
/// their first slot (only the bits below differ), in logs of many sizes.
#[test]
fn first_duplicate_matches_sorting() {
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut found = 0;
    for case in 0..300usize {
        let n = 1 + (next() % 20_000) as usize;
        let mut log = IdLog::new();
        let pool = match case % 4 {
            0 => 1 + next() % (2 * n as u64),
            1 => u64::MAX,
            _ => 0,
        };
        for row in 0..n {
            let key = match case % 4 {
                0 | 1 => id_key(format!("id{}", next() % pool).as_bytes()),
                2 => id_key(format!("r{}", if row == n - 1 { n / 2 } else { row }).as_bytes()),
                // one bucket, one first slot, digests apart in their low bits
                _ => (0xABCu128 << 116) | ((next() % (n as u64 / 2 + 1)) as u128) << 32,
            };
            log.push(key, row as u32);
        }
        let want = log.first_duplicate_sorted();
        assert_eq!(log.first_duplicate(), want, "case {case}, {n} rows");
        found += want.is_some() as usize;
    }
    assert!(found > 100, "{found}");
}

#[test]
fn messages_name_file_row_column() {
    let b = table(&["answer", "answer"], &["p/a0", "p/a0"], &[0, 1], &[3, 3]);
    let e = check(&b).unwrap_err().to_string();
    assert_eq!(
        e,
        "t.parquet, row 1, column `sample_id`: duplicate sample_id \"p/a0\""
    );
    // the first repeat in table order, whichever bucket its digest falls in
    let mut log = IdLog::new();
    for (row, id) in ["x", "y", "z", "y", "x", "z"].iter().enumerate() {
        log.push(id_key(id.as_bytes()), row as u32);
    }
    assert_eq!(log.first_duplicate(), Some((3, 1)));
    let mut log = IdLog::new();
    log.reserve(100);
    for row in 0..100 {
        log.push(id_key(format!("p{row}").as_bytes()), row);
    }
    assert_eq!(log.first_duplicate(), None);

    let b = table(
        &["answer", "confidence"],
        &["p/a0", "p/a1/c0"],
        &[0, 1],
        &[3, 3],
    );
    let e = check(&b).unwrap_err().to_string();
    assert!(
        e.starts_with("t.parquet, row 1, column `answer_idx`: confidence row whose answer"),
        "{e}"
    );

    let b = table(&["answer", "answer"], &["p/a0", "p/a1"], &[0, 1], &[3, 2]);
    let e = check(&b).unwrap_err().to_string();
    assert_eq!(
        e,
        "t.parquet, row 1, column `response_logprobs`: 2 values but `response_ids` has 3 tokens"
    );

    let b = table(&["answer", "bogus"], &["p/a0", "p/a1"], &[0, 1], &[3, 3]);
    let e = check(&b).unwrap_err().to_string();
    assert!(
        e.contains("row 1, column `sample_type`: unknown value \"bogus\""),
        "{e}"
    );

    let b = table(&["answer"], &["p/a0"], &[0], &[3]);
    let e = check_with(&b, &["acc_reward"]).unwrap_err().to_string();
    assert!(
        e.starts_with("t.parquet: column `acc_reward` is missing"),
        "{e}"
    );
}

#[test]
fn wrong_type_and_nulls_and_nan() {
    let schema = Arc::new(Schema::new(vec![Field::new(
        "reward",
        DataType::Utf8,
        false,
    )]));
    let e = check_schema("x.parquet", &schema, &TRAJECTORY, &[])
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "x.parquet: column `reward` has type Utf8, expected float32"
    );

    for (values, want) in [
        (
            Float32Array::from(vec![Some(1.0), None, Some(f32::NAN)]),
            "t.parquet, row 1, column `reward`: null where a value is required",
        ),
        (
            Float32Array::from(vec![1.0, f32::INFINITY]),
            "t.parquet, row 1, column `reward`: value inf is not a finite number",
        ),
    ] {
        let schema = Arc::new(Schema::new(vec![Field::new(
            "reward",
            DataType::Float32,
            true,
        )]));
        let b = RecordBatch::try_new(schema, vec![Arc::new(values)]).unwrap();
        assert_eq!(check_with(&b, &[]).unwrap_err().to_string(), want);
    }
}

#[test]
fn rows_count_across_batches_and_spans() {
    let b1 = table(&["answer"], &["p/a0"], &[0], &[3]);
    let b2 = table(&["answer"], &["p/a1"], &[1], &[3]);
    let b2 = set_columns(
        &b2,
        &TRAJECTORY,
        vec![("answer_span", build_spans(&[Some((1, 4))]))],
    )
    .unwrap();
    let mut v = Validator::new("t.parquet", &TRAJECTORY);
    v.check_batch(&b1).unwrap();
    let e = v.check_batch(&b2).unwrap_err().to_string();
    assert_eq!(e, "t.parquet, row 1, column `answer_span`: span {start: 1, end: 4} is outside the response's 3 tokens");
}
