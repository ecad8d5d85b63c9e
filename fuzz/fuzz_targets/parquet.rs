//! Parquet validation on arbitrary bytes: write them to a file, open it with `table::Reader`,
//! check the schema and every row with `table::Validator` (trajectory, prompts and probe specs).
//! Errors are fine; panics are bugs.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rlcr::table::{self, Reader, Validator, PROBE, PROMPTS, TRAJECTORY};

fuzz_target!(|data: &[u8]| {
    let Ok(dir) = tempfile::tempdir() else {
        return;
    };
    let path = dir.path().join("t.parquet");
    if std::fs::write(&path, data).is_err() {
        return;
    }
    for spec in [&TRAJECTORY, &PROMPTS, &PROBE] {
        let Ok(reader) = Reader::open(&path) else {
            return;
        };
        let _ = table::check_schema("t.parquet", &reader.schema(), spec, &[]);
        let mut v = Validator::new("t.parquet", spec);
        let mut ok = true;
        for b in reader {
            match b {
                Ok(b) => {
                    if v.check_batch(&b).is_err() {
                        ok = false;
                        break;
                    }
                }
                Err(_) => {
                    ok = false;
                    break;
                }
            }
        }
        if ok {
            let _ = v.finish();
        }
    }
});
