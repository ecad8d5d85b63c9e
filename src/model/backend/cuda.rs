//! Opening a CUDA device (`--device cuda[:N]`, builds with `--features cuda`).
//!
//! burn's CUDA runtime (cubecl-cuda) loads the driver (`libcuda`) and NVRTC (`libnvrtc`) at run
//! time and compiles its kernels from CUDA C++ with NVRTC, which reads the CUDA headers
//! (`cuda_fp16.h`, `cuda_bf16.h`, …) of a CUDA installation. When one of the three is missing it
//! panics, in a device thread, at the first tensor operation (or earlier: `cuInit`'s error is
//! unwrapped), and the caller sees a `RecvError`. [`open`] checks all three first, with the same
//! loaders and the same installation lookup as cubecl-cuda, names everything that is missing in
//! one error, then opens the device and runs one kernel with panics caught and their messages
//! kept off the terminal, so a machine that cannot run CUDA gets one line and exit 1.
use std::panic::{self, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::{bail, Result};
use burn::tensor::{Device, Tensor};

/// The oldest CUDA release this build supports, as `cuDriverGetVersion` and `CUDA_VERSION`
/// spell it: the version cudarc binds (`CUDARC_CUDA_VERSION` in `.cargo/config.toml`).
pub const OLDEST_CUDA: i32 = 12080;

/// The headers cubecl-cuda's generated kernels include (`#include <…>` in cubecl-cpp's CUDA
/// dialect for the types rlcr uses: f16, bf16, the matrix fragments).
const HEADERS: [&str; 3] = ["cuda_fp16.h", "cuda_bf16.h", "mma.h"];

/// `12080` → `12.8`.
fn version(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// Run `f` with panics caught and kept off stderr (every thread's, since cubecl-cuda panics in its
/// device thread): `Err` holds the first panic's message, on one line.
fn quietly<T>(f: impl FnOnce() -> T) -> std::result::Result<T, String> {
    let first: Arc<Mutex<Option<String>>> = Arc::default();
    let sink = first.clone();
    let previous = panic::take_hook();
    panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".into());
        if let Ok(mut slot) = sink.lock() {
            slot.get_or_insert(msg);
        }
    }));
    let result = panic::catch_unwind(AssertUnwindSafe(f));
    panic::set_hook(previous);
    result.map_err(|_| {
        let msg = first.lock().ok().and_then(|mut s| s.take());
        one_line(&msg.unwrap_or_else(|| "a panic without a message".into()))
    })
}

/// Whitespace runs (newlines included) collapsed to one space, and at most [`MAX_LINE`] characters
/// (a kernel compile error carries the kernel's whole source).
fn one_line(s: &str) -> String {
    let line = s.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(MAX_LINE) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line,
    }
}

/// The longest message [`one_line`] keeps.
const MAX_LINE: usize = 400;

/// What this machine lacks to run rlcr's CUDA build, each item a phrase (empty: nothing found
/// missing). Checks, without initialising CUDA: the driver library and its CUDA version, the NVRTC
/// library and its version, and the CUDA headers NVRTC is given.
pub fn missing() -> Vec<String> {
    let mut missing = Vec::new();
    let major = OLDEST_CUDA / 1000;
    // SAFETY: `is_culib_present` only tries to `dlopen` the library under cudarc's candidate
    // names; `cuDriverGetVersion` and `nvrtcVersion` write into the locals they are given.
    let driver = quietly(|| unsafe { cudarc::driver::sys::is_culib_present() }).unwrap_or(false);
    if !driver {
        missing.push(
            "no NVIDIA driver (libcuda.so.1 not found by the dynamic loader; install the driver \
             or add its folder to LD_LIBRARY_PATH)"
                .to_string(),
        );
    } else {
        let v = quietly(|| unsafe {
            let mut v = 0;
            cudarc::driver::sys::cuDriverGetVersion(&mut v)
                .result()
                .map(|()| v)
        });
        match v {
            Ok(Ok(v)) if v < OLDEST_CUDA => missing.push(format!(
                "the NVIDIA driver supports CUDA {} but this build needs {} or newer (driver 570+)",
                version(v),
                version(OLDEST_CUDA)
            )),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => missing.push(format!("the NVIDIA driver's version: {e}")),
            Err(e) => missing.push(format!("the NVIDIA driver's version: {e}")),
        }
    }
    let nvrtc = quietly(|| unsafe { cudarc::nvrtc::sys::is_culib_present() }).unwrap_or(false);
    if !nvrtc {
        missing.push(format!(
            "no NVRTC (libnvrtc.so or libnvrtc.so.{major} not found by the dynamic loader; a CUDA \
             toolkit's lib64 folder has libnvrtc.so: add it to LD_LIBRARY_PATH)"
        ));
    } else {
        let v = quietly(|| unsafe {
            let (mut a, mut b) = (0, 0);
            let r = cudarc::nvrtc::sys::nvrtcVersion(&mut a, &mut b);
            (r, a * 1000 + b * 10)
        });
        match v {
            Ok((cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS, v)) if v < OLDEST_CUDA => missing
                .push(format!(
                    "NVRTC is CUDA {} but this build needs {} or newer",
                    version(v),
                    version(OLDEST_CUDA)
                )),
            Ok((cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS, _)) => {}
            Ok((r, _)) => missing.push(format!("NVRTC's version: {r:?}")),
            Err(e) => missing.push(format!("NVRTC's version: {e}")),
        }
    }
    match cubecl_cuda::install::cuda_path() {
        None => missing.push(
            "no CUDA headers (no CUDA installation: set CUDA_PATH to one; looked for \
             /usr/local/cuda, /opt/cuda and /usr/bin/nvcc)"
                .to_string(),
        ),
        Some(root) => {
            let include: PathBuf = root.join("include");
            let absent: Vec<&str> = HEADERS
                .iter()
                .copied()
                .filter(|h| !include.join(h).is_file())
                .collect();
            if !absent.is_empty() {
                let from = if std::env::var_os("CUDA_PATH").is_some() {
                    "CUDA_PATH"
                } else {
                    "the default location; set CUDA_PATH to another installation"
                };
                missing.push(format!(
                    "no CUDA headers ({} not in {}, from {from})",
                    absent.join(", "),
                    include.display()
                ));
            }
        }
    }
    missing
}

/// A driver error as its code (`CUDA_ERROR_NO_DEVICE`) and, when the driver can say it, its
/// description (`cuGetErrorString`, called with panics caught: a library without it is a
/// message, not a panic).
fn driver_error(e: cudarc::driver::DriverError) -> String {
    let code = format!("{:?}", e.0);
    match quietly(|| e.error_string().map(|s| s.to_string_lossy().into_owned())) {
        Ok(Ok(text)) if !text.is_empty() => format!("{code} ({text})"),
        _ => code,
    }
}

/// Open CUDA device `index`: checks this machine first ([`missing`]), then the device count,
/// then compiles and runs one kernel, each failure an error (never a panic) on one line.
pub fn open(index: usize) -> Result<Device> {
    let spec = crate::model::DeviceSpec::Cuda(index);
    let missing = missing();
    if !missing.is_empty() {
        bail!(
            "--device {spec}: this machine cannot run CUDA: {}",
            missing.join("; ")
        );
    }
    // The driver: `cuInit`, then the device count and the device's name.
    let name = quietly(|| -> std::result::Result<String, String> {
        use cudarc::driver::result as cu;
        cu::init().map_err(|e| format!("cuInit failed: {}", driver_error(e)))?;
        let count = cu::device::get_count().map_err(driver_error)?;
        if index >= count.max(0) as usize {
            let names: Vec<String> = (0..count)
                .map(|i| {
                    let n = cu::device::get(i)
                        .and_then(cu::device::get_name)
                        .unwrap_or_else(driver_error);
                    format!("cuda:{i} = {n}")
                })
                .collect();
            return Err(if count == 0 {
                "the driver sees no CUDA device".to_string()
            } else {
                format!(
                    "this machine has {count} CUDA device(s): {}",
                    names.join(", ")
                )
            });
        }
        cu::device::get(index as i32)
            .and_then(cu::device::get_name)
            .map_err(driver_error)
    });
    let name = match name {
        Ok(Ok(name)) => name,
        Ok(Err(e)) | Err(e) => bail!("--device {spec}: {}", one_line(&e)),
    };
    // burn's runtime: its device thread starts here, and one reduction compiles (NVRTC, the
    // headers) and runs a kernel.
    let device = Device::cuda(index);
    let check = quietly(|| {
        let t = Tensor::<1>::from_floats([1.0f32, 2.0, 3.0, 4.0], &device);
        crate::model::read_f32(t.sum())
    });
    match check {
        Ok(Ok(v)) if v == [10.0] => {}
        Ok(Ok(v)) => bail!("--device {spec} ({name}): a test reduction gave {v:?}, not [10.0]"),
        Ok(Err(e)) => bail!("--device {spec} ({name}): {}", one_line(&format!("{e:#}"))),
        Err(e) => bail!("--device {spec} ({name}): CUDA failed: {e}"),
    }
    super::mark_cuda_opened();
    crate::model::transfer::count_launches();
    crate::info!("device: {spec} ({name})");
    Ok(device)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_lines() {
        assert_eq!(version(12080), "12.8");
        assert_eq!(version(13000), "13.0");
        assert_eq!(one_line("a\n  b\tc \n"), "a b c");
        let long = one_line(&"é ".repeat(1000));
        assert_eq!(long.chars().count(), MAX_LINE + 1);
        assert!(long.ends_with('…'));
    }

    #[test]
    fn panics_become_errors_and_stay_quiet() {
        assert_eq!(quietly(|| 3), Ok(3));
        let e = quietly(|| -> u8 { panic!("boom\nsecond line") }).unwrap_err();
        assert_eq!(e, "boom second line");
        // In another thread (as in cubecl-cuda's device thread), joined by a panicking caller.
        let e = quietly(|| {
            std::thread::spawn(|| panic!("device thread: {}", 7))
                .join()
                .unwrap_or_else(|_| panic!("caller"))
        })
        .unwrap_err();
        assert_eq!(e, "device thread: 7");
    }
}
