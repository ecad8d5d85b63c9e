//! Every `RLCR_*` environment variable rlcr reads, in one place: read once per process, typed,
//! each documented with what it changes, its default and why it exists ([`VARIABLES`], which
//! `docs/environment.md` lists).
//!
//! Most are **numeric switches**: they choose between two implementations of the same function
//! (rlcr's CPU kernels or burn's ops, a fused op or burn's composite, packed or plain decode
//! weights) that agree up to rounding. Rounding moves a learning loop's trajectories, so the
//! switches in force are part of an output's provenance: every table records them in its
//! key-value metadata as `rlcr.switches` (beside `rlcr.config`), and every model folder written by
//! `update` or `sft` in `rlcr-train/trainer_state.json` (`switches`). See
//! [`Switches::recorded`].
//!
//! **Bad values are errors.** The binary parses every variable before it does anything else
//! ([`init`]); a value outside a variable's grammar stops it with one line naming the variable,
//! the value and the accepted ones (exit 1), instead of running with a default the user did not
//! ask for.
//!
//! **Why here and not in the kernels crate.** `rlcr-kernels` is a library of functions on slices:
//! each kernel takes its instruction-set level ([`Isa`]) and precision as arguments and reads no
//! environment, so it has no process-wide state to configure. The choices are the process's, so
//! they live in rlcr, the one crate that knows the process (the binary validates them at start
//! up); the kernels crate only provides the vocabulary ([`Isa::parse`], [`PackPrecision`]).
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;
use std::sync::OnceLock;

pub use rlcr_kernels::decode::PackPrecision;
pub use rlcr_kernels::Isa;

/// Which implementation of an op runs on the CPU backend (Flex): rlcr's kernels or burn's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// rlcr's own kernel.
    Rlcr,
    /// burn's op (or composite of ops).
    Burn,
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::Rlcr => "rlcr",
            Path::Burn => "burn",
        }
    }
}

/// `RLCR_MALLOC`: glibc's allocator settings (see [`crate::alloc`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Malloc {
    /// Keep freed buffers in the process (the default).
    Retain,
    /// glibc's defaults.
    Default,
}

/// `RLCR_GPU_F32`: how f32 matrix products run on a GPU backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuF32 {
    /// [`GpuF32::Split`] on CUDA devices, whose f32 matmul is TF32; the plain product elsewhere.
    Auto,
    /// The backend's f32 matmul as it is: on NVIDIA GPUs since Ampere, burn's CUDA backend runs
    /// it on the tensor cores in TF32 (operands rounded to 10-bit mantissas).
    Fast,
    /// Four products of operands split into a bf16 head and an f32 remainder
    /// ([`crate::model::transformer`]'s `split_matmul`): f32-accurate on TF32 tensor cores.
    Split,
}

/// `RLCR_CUDA_GRAPH`: whether the sampler records its decode step once per batch width and
/// replays it ([`crate::model::graph`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudaGraph {
    /// Every step launches its kernels (the default until the replay is timed on CUDA).
    Off,
    /// Replayed on a CUDA device (a CUDA graph), launched elsewhere.
    Auto,
    /// Replayed on any GPU device (on wgpu, cubecl's software graph: the tests' path).
    On,
}

/// The switches in force, parsed from the environment ([`get`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Switches {
    /// `RLCR_CPU_ISA` as asked (`None`: `auto`).
    pub cpu_isa: Option<Isa>,
    /// The kernel level in use: the request lowered to what the CPU has, or the CPU's best.
    pub isa: Isa,
    /// `RLCR_GEMM`.
    pub gemm: Path,
    /// `RLCR_ATTENTION`.
    pub attention: Path,
    /// `RLCR_NORM`.
    pub norm: Path,
    /// `RLCR_SWIGLU`.
    pub swiglu: Path,
    /// `RLCR_ROPE`.
    pub rope: Path,
    /// `RLCR_FUSED_HEAD`.
    pub fused_head: bool,
    /// `RLCR_DECODE_PACK`.
    pub decode_pack: bool,
    /// `RLCR_DECODE_BF16`.
    pub decode_bf16: PackPrecision,
    /// `RLCR_WEIGHTS_BF16`.
    pub weights_bf16: bool,
    /// `RLCR_GPU_F32`.
    pub gpu_f32: GpuF32,
    /// `RLCR_CUDA_GRAPH`.
    pub cuda_graph: CudaGraph,
    /// `RLCR_MALLOC`.
    pub malloc: Malloc,
    /// `RLCR_CONFIG`: the run configuration file used when `--config` is not given.
    pub config: Option<PathBuf>,
    /// `RLCR_TEST_SLOW_WRITE`, milliseconds (0: off).
    pub test_slow_write_ms: u64,
}

/// One documented environment variable.
#[derive(Debug, Clone, Copy)]
pub struct Variable {
    /// `RLCR_…`.
    pub name: &'static str,
    /// The accepted values, as written in the documentation and in errors.
    pub values: &'static str,
    /// The value when unset (or empty).
    pub default: &'static str,
    /// What it changes and why it exists.
    pub doc: &'static str,
    /// Whether it is recorded in outputs' metadata (it can change numbers or memory use).
    pub recorded: bool,
}

/// Every variable rlcr reads, in the order of `docs/environment.md`.
pub const VARIABLES: &[Variable] = &[
    Variable {
        name: "RLCR_CPU_ISA",
        values: "auto, avx512, avx2, scalar",
        default: "auto",
        doc: "Instruction-set level of rlcr's CPU kernels. `auto` uses the best the CPU has \
              (AVX-512F, else AVX2 + FMA); a lower level can be forced, a higher one is lowered to \
              the CPU's. avx512 and avx2 give the same bits (one fused multiply-add per term, \
              summed in the order of K), so forcing avx2 changes the speed only; `scalar` turns \
              rlcr's kernels off and every product goes through burn's matmul (last-bit \
              differences). Exists to compare the levels and to run as on an older CPU.",
        recorded: true,
    },
    Variable {
        name: "RLCR_GEMM",
        values: "rlcr, burn",
        default: "rlcr",
        doc: "Matrix products on the CPU: rlcr's blocked GEMM (deterministic: each output one \
              fused multiply-add chain over K, whatever the batch and threads) or burn's matmul \
              (the gemm crate, which splits K). The two round differently, so a loop's numbers \
              move with the choice. `burn` also turns rlcr's attention off (it is built on the \
              GEMM). Exists to compare against burn.",
        recorded: true,
    },
    Variable {
        name: "RLCR_ATTENTION",
        values: "rlcr, burn",
        default: "rlcr",
        doc: "Masked attention on the CPU (prefill, scoring, training): rlcr's kernels or burn's \
              attention (a composite of batched products and softmax, serial in places). They \
              round differently.",
        recorded: true,
    },
    Variable {
        name: "RLCR_NORM",
        values: "rlcr, burn",
        default: "burn",
        doc: "RMSNorm on the CPU: rlcr's fused op (one pass forward, one backward) or burn's \
              composite. Opt-in: the fused op sums each row in its own order (within 2e-6 of the \
              composite), and with that rounding the tiny model's learning check falls below its \
              AUROC bar.",
        recorded: true,
    },
    Variable {
        name: "RLCR_SWIGLU",
        values: "rlcr, burn",
        default: "rlcr",
        doc: "The SwiGLU gate on the CPU: rlcr's fused op or burn's composite; the same bits \
              forward and backward, the fused op keeps less memory.",
        recorded: true,
    },
    Variable {
        name: "RLCR_ROPE",
        values: "rlcr, burn",
        default: "rlcr",
        doc: "Rotary position embedding on the CPU: rlcr's fused op or burn's composite; the \
              same bits, the fused op reads the strided view in place.",
        recorded: true,
    },
    Variable {
        name: "RLCR_FUSED_HEAD",
        values: "1, 0",
        default: "1",
        doc: "The LM head's log-probs and entropies on the CPU in one pass over the logits (1) \
              or burn's composite (0), which materialises several [rows, vocab] tensors (18 % \
              more peak memory on a SmolLM2-135M update step). They agree within 2e-5; the \
              rounding moves a loop's trajectories.",
        recorded: true,
    },
    Variable {
        name: "RLCR_DECODE_PACK",
        values: "1, 0",
        default: "1",
        doc: "Sampling packs every weight matrix into column panels on its first decode step \
              (faster decoding, a second copy of the weights in memory); 0 keeps the row-major \
              weights. The results are the same.",
        recorded: true,
    },
    Variable {
        name: "RLCR_DECODE_BF16",
        values: "exact, 1 (or round), 0",
        default: "exact",
        doc: "Precision of the packed decode weights. `exact`: bf16 panels for matrices whose \
              values are all bf16 numbers (a bf16 checkpoint), f32 otherwise, the same results \
              with half the bytes; `1`/`round` rounds every matrix to bf16 (faster, changes the \
              numbers); `0` keeps f32 panels.",
        recorded: true,
    },
    Variable {
        name: "RLCR_WEIGHTS_BF16",
        values: "1, 0",
        default: "1",
        doc: "Sampling, log-probs and a frozen LoRA base hold the matrices a checkpoint stores in \
              bf16 in bf16 (half the memory; every product widens them exactly, so the results \
              are those of f32); 0 widens them to f32 at load (a CPU without AVX2, where each \
              product would otherwise widen them again). Training every weight holds f32 master \
              weights either way.",
        recorded: true,
    },
    Variable {
        name: "RLCR_GPU_F32",
        values: "auto, fast, split",
        default: "auto",
        doc: "f32 matrix products (linear layers, attention, the LM head) on a GPU device. \
              `fast`: the backend's f32 matmul, which burn's CUDA backend runs on the tensor \
              cores in TF32 on NVIDIA GPUs since Ampere (operands keep 10 of f32's 23 mantissa \
              bits, like torch with `allow_tf32`: on an H200, 2.9e-3 from float64 on the tiny \
              model's log-probs and 0.25 on a random SmolLM2-135M); `split`: each operand split \
              into a bf16 head and its remainder and the four products summed (`a·b = aₕ·bₕ + \
              aₕ·bₗ + aₗ·bₕ + aₗ·bₗ`), f32-accurate on those tensor cores (8.8e-6 and 1.0e-3 \
              there) at four times the products (an `update` step 2.4 times slower); `auto`: \
              `split` on CUDA, the plain product elsewhere. No effect on wgpu (no bf16 type), \
              with `--precision bf16`, or on the CPU, whose products are rlcr's f32 kernels \
              (unless `RLCR_GEMM=burn`).",
        recorded: true,
    },
    Variable {
        name: "RLCR_CUDA_GRAPH",
        values: "off, auto, on",
        default: "off",
        doc: "Sampling on a GPU: `auto` records a decode step (every layer, the LM head and the \
              draw) once per batch width on a CUDA device and replays it as a CUDA graph at \
              every later step of the wave, writing only the step's tokens, positions and \
              uniforms into buffers the recording saw: one dispatch a step instead of a launch \
              a kernel (about 27 µs of host time each on an H200). Rows that finish stay in the \
              batch, masked, until half of it has finished; the cache is then compacted and the \
              step recorded again. `on` replays on any GPU device (on wgpu, cubecl's software \
              graph), `off` launches every step. The replayed steps equal the same steps \
              launched one by one bit for bit on wgpu; `off` is the default until the replay \
              has been timed on CUDA. No effect on the CPU, which has no launches to save.",
        recorded: true,
    },
    Variable {
        name: "RLCR_MALLOC",
        values: "retain, default",
        default: "retain",
        doc: "glibc's malloc settings: `retain` keeps freed tensor buffers in the process (no \
              per-block mmap, no trimming, one arena), which removes most page faults of a \
              training step at the price of keeping the peak heap until exit; `default` keeps \
              glibc's defaults, to measure the difference.",
        recorded: true,
    },
    Variable {
        name: "RLCR_CONFIG",
        values: "a TOML file",
        default: "none",
        doc: "The run configuration file every stage reads when `--config` is not given (see \
              `rlcr --help`): export it once and each stage of a loop picks its own section.",
        recorded: false,
    },
    Variable {
        name: "RLCR_TEST_SLOW_WRITE",
        values: "milliseconds",
        default: "0",
        doc: "Test hook: every output write pauses this long after each Parquet batch and \
              before its final rename, so a test can kill a stage while its output is half \
              written. Never needed in use.",
        recorded: false,
    },
];

/// A variable set to a value outside its grammar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwitchError {
    /// The variable.
    pub name: &'static str,
    /// Its value (lossy UTF-8).
    pub value: String,
}

impl fmt::Display for SwitchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let values = VARIABLES
            .iter()
            .find(|v| v.name == self.name)
            .map_or("", |v| v.values);
        write!(
            f,
            "environment variable {}={:?} is not valid: expected {values} (or unset)",
            self.name, self.value
        )
    }
}

impl std::error::Error for SwitchError {}

impl Switches {
    /// Parse the switches from `lookup` (the environment in [`Switches::from_env`]). Unset and
    /// empty both mean the default. The first invalid variable, in [`VARIABLES`] order, is the
    /// error.
    pub fn parse(lookup: impl Fn(&str) -> Option<OsString>) -> Result<Self, SwitchError> {
        // The variable's value, `None` when unset or empty; an error when not UTF-8.
        let get = |name: &'static str| -> Result<Option<String>, SwitchError> {
            match lookup(name) {
                None => Ok(None),
                Some(v) if v.is_empty() => Ok(None),
                Some(v) => v.into_string().map(Some).map_err(|v| SwitchError {
                    name,
                    value: v.to_string_lossy().into_owned(),
                }),
            }
        };
        let bad = |name: &'static str, value: &str| SwitchError {
            name,
            value: value.to_string(),
        };
        let path = |name: &'static str, default: Path| -> Result<Path, SwitchError> {
            match get(name)?.as_deref() {
                None => Ok(default),
                Some("rlcr") => Ok(Path::Rlcr),
                Some("burn") => Ok(Path::Burn),
                Some(v) => Err(bad(name, v)),
            }
        };
        let flag = |name: &'static str| -> Result<bool, SwitchError> {
            match get(name)?.as_deref() {
                None | Some("1") => Ok(true),
                Some("0") => Ok(false),
                Some(v) => Err(bad(name, v)),
            }
        };
        let cpu_isa = match get("RLCR_CPU_ISA")?.as_deref() {
            None => None,
            Some(v) if v.trim().eq_ignore_ascii_case("auto") => None,
            Some(v) => Some(Isa::parse(v).ok_or_else(|| bad("RLCR_CPU_ISA", v))?),
        };
        let gemm = path("RLCR_GEMM", Path::Rlcr)?;
        let attention = path("RLCR_ATTENTION", Path::Rlcr)?;
        let norm = path("RLCR_NORM", Path::Burn)?;
        let swiglu = path("RLCR_SWIGLU", Path::Rlcr)?;
        let rope = path("RLCR_ROPE", Path::Rlcr)?;
        let fused_head = flag("RLCR_FUSED_HEAD")?;
        let decode_pack = flag("RLCR_DECODE_PACK")?;
        let decode_bf16 = match get("RLCR_DECODE_BF16")?.as_deref() {
            None | Some("exact") => PackPrecision::Bf16IfExact,
            Some("1") | Some("round") => PackPrecision::Bf16Rounded,
            Some("0") => PackPrecision::F32,
            Some(v) => return Err(bad("RLCR_DECODE_BF16", v)),
        };
        let weights_bf16 = flag("RLCR_WEIGHTS_BF16")?;
        let gpu_f32 = match get("RLCR_GPU_F32")?.as_deref() {
            None | Some("auto") => GpuF32::Auto,
            Some("fast") => GpuF32::Fast,
            Some("split") => GpuF32::Split,
            Some(v) => return Err(bad("RLCR_GPU_F32", v)),
        };
        let cuda_graph = match get("RLCR_CUDA_GRAPH")?.as_deref() {
            None | Some("off") => CudaGraph::Off,
            Some("auto") => CudaGraph::Auto,
            Some("on") => CudaGraph::On,
            Some(v) => return Err(bad("RLCR_CUDA_GRAPH", v)),
        };
        let malloc = match get("RLCR_MALLOC")?.as_deref() {
            None | Some("retain") => Malloc::Retain,
            Some("default") => Malloc::Default,
            Some(v) => return Err(bad("RLCR_MALLOC", v)),
        };
        let config = get("RLCR_CONFIG")?.map(PathBuf::from);
        let test_slow_write_ms = match get("RLCR_TEST_SLOW_WRITE")? {
            None => 0,
            Some(v) => v
                .trim()
                .parse()
                .map_err(|_| bad("RLCR_TEST_SLOW_WRITE", &v))?,
        };
        Ok(Switches {
            cpu_isa,
            isa: cpu_isa.map_or_else(Isa::detected, Isa::clamp),
            gemm,
            attention,
            norm,
            swiglu,
            rope,
            fused_head,
            decode_pack,
            decode_bf16,
            weights_bf16,
            gpu_f32,
            cuda_graph,
            malloc,
            config,
            test_slow_write_ms,
        })
    }

    /// [`Switches::parse`] over the process environment.
    pub fn from_env() -> Result<Self, SwitchError> {
        Self::parse(|name| std::env::var_os(name))
    }

    /// The switches as recorded in outputs (`rlcr.switches`): every variable that can change a
    /// result or the memory a run needs, by name, with the value in force (set or default).
    /// `RLCR_CPU_ISA` is the level that ran, after lowering to the CPU's.
    pub fn recorded(&self) -> BTreeMap<&'static str, String> {
        let flag = |on: bool| if on { "1" } else { "0" }.to_string();
        BTreeMap::from([
            ("RLCR_CPU_ISA", self.isa.name().to_string()),
            ("RLCR_GEMM", self.gemm.name().to_string()),
            ("RLCR_ATTENTION", self.attention.name().to_string()),
            ("RLCR_NORM", self.norm.name().to_string()),
            ("RLCR_SWIGLU", self.swiglu.name().to_string()),
            ("RLCR_ROPE", self.rope.name().to_string()),
            ("RLCR_FUSED_HEAD", flag(self.fused_head)),
            ("RLCR_DECODE_PACK", flag(self.decode_pack)),
            (
                "RLCR_DECODE_BF16",
                match self.decode_bf16 {
                    PackPrecision::Bf16IfExact => "exact",
                    PackPrecision::Bf16Rounded => "round",
                    PackPrecision::F32 => "0",
                }
                .to_string(),
            ),
            ("RLCR_WEIGHTS_BF16", flag(self.weights_bf16)),
            (
                "RLCR_GPU_F32",
                match self.gpu_f32 {
                    GpuF32::Auto => "auto",
                    GpuF32::Fast => "fast",
                    GpuF32::Split => "split",
                }
                .to_string(),
            ),
            (
                "RLCR_CUDA_GRAPH",
                match self.cuda_graph {
                    CudaGraph::Off => "off",
                    CudaGraph::Auto => "auto",
                    CudaGraph::On => "on",
                }
                .to_string(),
            ),
            (
                "RLCR_MALLOC",
                match self.malloc {
                    Malloc::Retain => "retain",
                    Malloc::Default => "default",
                }
                .to_string(),
            ),
        ])
    }

    /// [`Switches::recorded`] as a JSON object.
    pub fn recorded_json(&self) -> serde_json::Value {
        serde_json::Value::Object(
            self.recorded()
                .into_iter()
                .map(|(k, v)| (k.to_string(), serde_json::Value::String(v)))
                .collect(),
        )
    }
}

static SWITCHES: OnceLock<Switches> = OnceLock::new();

/// Parse the environment once for the process; the binary calls it first thing and stops with
/// the error (exit 1) on a bad value. Later calls return the first answer.
pub fn init() -> Result<&'static Switches, SwitchError> {
    if let Some(s) = SWITCHES.get() {
        return Ok(s);
    }
    let s = Switches::from_env()?;
    Ok(SWITCHES.get_or_init(|| s))
}

/// The switches in force. In the binary they were validated by [`init`]; a library user who
/// never called it gets them parsed here, and a bad value panics with the same message (a
/// switch is never ignored).
pub fn get() -> &'static Switches {
    match init() {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<Switches, SwitchError> {
        let map: BTreeMap<String, OsString> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        Switches::parse(|name| map.get(name).cloned())
    }

    #[test]
    fn unset_and_empty_give_the_defaults() {
        let unset = parse(&[]).expect("defaults");
        let empty: Vec<(&str, &str)> = VARIABLES.iter().map(|v| (v.name, "")).collect();
        assert_eq!(parse(&empty).expect("empty"), unset);
        assert_eq!(unset.cpu_isa, None);
        assert_eq!(unset.isa, Isa::detected());
        assert_eq!(
            (
                unset.gemm,
                unset.attention,
                unset.norm,
                unset.swiglu,
                unset.rope
            ),
            (Path::Rlcr, Path::Rlcr, Path::Burn, Path::Rlcr, Path::Rlcr)
        );
        assert!(unset.fused_head && unset.decode_pack && unset.weights_bf16);
        assert_eq!(unset.decode_bf16, PackPrecision::Bf16IfExact);
        assert_eq!(unset.malloc, Malloc::Retain);
        assert_eq!(unset.gpu_f32, GpuF32::Auto);
        assert_eq!(unset.cuda_graph, CudaGraph::Off);
        assert_eq!(unset.config, None);
        assert_eq!(unset.test_slow_write_ms, 0);
        // The documented defaults are the parsed ones.
        let rec = unset.recorded();
        for v in VARIABLES.iter().filter(|v| v.recorded) {
            if v.name != "RLCR_CPU_ISA" {
                assert_eq!(rec[v.name], v.default, "{}", v.name);
            }
        }
    }

    #[test]
    fn every_value_of_the_grammar_is_read() {
        let s = parse(&[
            ("RLCR_CPU_ISA", "scalar"),
            ("RLCR_GEMM", "burn"),
            ("RLCR_ATTENTION", "burn"),
            ("RLCR_NORM", "rlcr"),
            ("RLCR_SWIGLU", "burn"),
            ("RLCR_ROPE", "burn"),
            ("RLCR_FUSED_HEAD", "0"),
            ("RLCR_DECODE_PACK", "0"),
            ("RLCR_DECODE_BF16", "round"),
            ("RLCR_WEIGHTS_BF16", "0"),
            ("RLCR_GPU_F32", "split"),
            ("RLCR_CUDA_GRAPH", "on"),
            ("RLCR_MALLOC", "default"),
            ("RLCR_CONFIG", "run.toml"),
            ("RLCR_TEST_SLOW_WRITE", "25"),
        ])
        .expect("valid");
        assert_eq!((s.cpu_isa, s.isa), (Some(Isa::Scalar), Isa::Scalar));
        assert_eq!(
            (s.gemm, s.attention, s.norm, s.swiglu, s.rope),
            (Path::Burn, Path::Burn, Path::Rlcr, Path::Burn, Path::Burn)
        );
        assert!(!s.fused_head && !s.decode_pack && !s.weights_bf16);
        assert_eq!(s.decode_bf16, PackPrecision::Bf16Rounded);
        assert_eq!(s.malloc, Malloc::Default);
        assert_eq!(s.gpu_f32, GpuF32::Split);
        assert_eq!(s.cuda_graph, CudaGraph::On);
        assert_eq!(
            parse(&[("RLCR_CUDA_GRAPH", "auto")]).unwrap().cuda_graph,
            CudaGraph::Auto
        );
        assert_eq!(s.config, Some(PathBuf::from("run.toml")));
        assert_eq!(s.test_slow_write_ms, 25);
        let rec = s.recorded();
        assert_eq!(rec["RLCR_CPU_ISA"], "scalar");
        assert_eq!(rec["RLCR_GEMM"], "burn");
        assert_eq!(rec["RLCR_DECODE_BF16"], "round");
        assert_eq!(rec["RLCR_FUSED_HEAD"], "0");
        assert_eq!(rec["RLCR_GPU_F32"], "split");
        assert_eq!(rec["RLCR_CUDA_GRAPH"], "on");
        assert_eq!(
            parse(&[("RLCR_GPU_F32", "fast")]).unwrap().gpu_f32,
            GpuF32::Fast
        );
        assert!(!rec.contains_key("RLCR_CONFIG") && !rec.contains_key("RLCR_TEST_SLOW_WRITE"));
        assert_eq!(
            parse(&[("RLCR_DECODE_BF16", "1")]).unwrap().decode_bf16,
            PackPrecision::Bf16Rounded
        );
        assert_eq!(
            parse(&[("RLCR_DECODE_BF16", "0")]).unwrap().decode_bf16,
            PackPrecision::F32
        );
        // The ISA is lowered to the CPU's, never raised.
        let high = parse(&[("RLCR_CPU_ISA", "AVX512")]).unwrap();
        assert_eq!(high.cpu_isa, Some(Isa::Avx512));
        assert_eq!(high.isa, Isa::Avx512.clamp());
        assert_eq!(parse(&[("RLCR_CPU_ISA", "auto")]).unwrap().cpu_isa, None);
    }

    /// A value outside the grammar is an error naming the variable, the value and the accepted
    /// values; before, `RLCR_GEMM=fast` or `RLCR_DECODE_BF16=yes` ran with the default.
    #[test]
    fn a_bad_value_is_an_error_naming_variable_value_and_grammar() {
        for (name, value) in [
            ("RLCR_CPU_ISA", "sse2"),
            ("RLCR_GEMM", "fast"),
            ("RLCR_ATTENTION", "RLCR"),
            ("RLCR_NORM", "1"),
            ("RLCR_SWIGLU", "on"),
            ("RLCR_ROPE", "yes"),
            ("RLCR_FUSED_HEAD", "on"),
            ("RLCR_DECODE_PACK", "false"),
            ("RLCR_DECODE_BF16", "yes"),
            ("RLCR_GPU_F32", "tf32"),
            ("RLCR_CUDA_GRAPH", "1"),
            ("RLCR_MALLOC", "jemalloc"),
            ("RLCR_TEST_SLOW_WRITE", "soon"),
        ] {
            let e = parse(&[(name, value)]).expect_err(name);
            assert_eq!((e.name, e.value.as_str()), (name, value));
            let line = e.to_string();
            let grammar = VARIABLES.iter().find(|v| v.name == name).unwrap().values;
            assert!(
                line.contains(name) && line.contains(value) && line.contains(grammar),
                "{line}"
            );
            assert!(!line.contains('\n'), "{line}");
        }
    }

    #[test]
    fn every_variable_is_documented_once() {
        let mut names: Vec<&str> = VARIABLES.iter().map(|v| v.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), VARIABLES.len());
        let rec = parse(&[]).unwrap().recorded();
        let documented: Vec<&str> = VARIABLES
            .iter()
            .filter(|v| v.recorded)
            .map(|v| v.name)
            .collect();
        let mut recorded: Vec<&str> = rec.keys().copied().collect();
        recorded.sort();
        let mut documented_sorted = documented.clone();
        documented_sorted.sort();
        assert_eq!(recorded, documented_sorted);
    }
}
