//! [`rlcr::alloc::retain_freed_memory`] in a process of its own (no libtest harness: the
//! settings must come before any other thread allocates, as in `rlcr`'s `main`).
//!
//! Two threads allocate, touch and free 12, 40 and 262 MB blocks (a training step's shapes) ten
//! times each. With the settings, freed blocks are reused: the minor page faults stay near one
//! fault per 4 KiB page of the peak footprint. The same workload in a child process with
//! `RLCR_MALLOC=default` (glibc's defaults) must fault every round, which shows that the check
//! can fail.

fn minor_faults() -> u64 {
    // /proc/self/stat field 10 (minflt), counted after the command name's closing parenthesis.
    let s = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    let rest = s.rsplit(')').next().unwrap_or("");
    rest.split_whitespace()
        .nth(7)
        .and_then(|v| v.parse().ok())
        .expect("minflt field")
}

const SIZES: [usize; 3] = [12 << 20, 40 << 20, 262 << 20];
const ROUNDS: usize = 10;

/// Faults of the workload, in 4 KiB pages.
fn workload() -> u64 {
    let before = minor_faults();
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                for _ in 0..ROUNDS {
                    for &bytes in &SIZES {
                        let v = std::hint::black_box(vec![1u8; bytes]);
                        drop(v);
                    }
                }
            });
        }
    });
    minor_faults() - before
}

fn main() {
    if !cfg!(all(target_os = "linux", target_env = "gnu")) {
        println!("alloc: not glibc, nothing to test");
        return;
    }
    // One full footprint: both threads' largest live blocks.
    let footprint_pages = (2 * SIZES.iter().sum::<usize>() / 4096) as u64;
    if std::env::var_os("RLCR_ALLOC_CHILD").is_some() {
        // The child: glibc's defaults (RLCR_MALLOC=default), report the faults.
        assert!(!rlcr::alloc::retain_freed_memory());
        println!("faults {}", workload());
        return;
    }
    assert!(
        rlcr::alloc::retain_freed_memory(),
        "mallopt refused the settings"
    );
    assert!(
        rlcr::alloc::retain_freed_memory(),
        "a second call reports the same"
    );
    let faults = workload();
    println!("alloc: {faults} faults with the settings ({footprint_pages} pages of footprint)");
    assert!(
        faults < 2 * footprint_pages,
        "{faults} page faults: freed blocks were not reused (footprint {footprint_pages} pages)"
    );
    let out = std::process::Command::new(std::env::current_exe().expect("own path"))
        .env("RLCR_ALLOC_CHILD", "1")
        .env("RLCR_MALLOC", "default")
        .output()
        .expect("run the child");
    assert!(out.status.success(), "child failed: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let child: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("faults "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no fault count in {text:?}"));
    println!("alloc: {child} faults with glibc's defaults");
    assert!(
        child > 4 * footprint_pages,
        "glibc's defaults faulted only {child} times: the test would not notice a regression"
    );
    println!("alloc: ok");
}
