//! Which kernels run: [`Isa`], detected at run time. The kernels take their level as an argument;
//! the process-wide choice (the CPU's best, or a lower level the user asked for) is the caller's.

/// Which of rlcr's own CPU kernels run (ordered: each level includes the one below).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// None of rlcr's SIMD kernels: every product goes through burn's `matmul` (gemm, which
    /// dispatches on the CPU by itself). What a CPU without AVX2/FMA, or another architecture,
    /// runs.
    Scalar,
    /// 256-bit kernels (AVX2 + FMA): 6 rows × 16 columns per register tile.
    Avx2,
    /// 512-bit kernels (AVX-512F): up to 12 rows × 32 columns per register tile.
    Avx512,
}

impl Isa {
    /// The best level this CPU runs.
    pub fn detected() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma");
            if avx2 && std::arch::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if avx2 {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }

    /// `scalar`, `avx2`, `avx512` (any case; `none`, `avx-512` too).
    pub fn parse(s: &str) -> Option<Isa> {
        match s.trim().to_ascii_lowercase().as_str() {
            "scalar" | "none" => Some(Isa::Scalar),
            "avx2" => Some(Isa::Avx2),
            "avx512" | "avx-512" => Some(Isa::Avx512),
            _ => None,
        }
    }

    /// The level's name, as [`Isa::parse`] reads it.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// `self`, lowered to what the CPU has (a request above it cannot run).
    pub fn clamp(self) -> Isa {
        self.min(Isa::detected())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn isa_names_parse_and_clamp() {
        for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
            assert_eq!(Isa::parse(isa.name()), Some(isa));
        }
        assert_eq!(Isa::parse(" AVX512 "), Some(Isa::Avx512));
        assert_eq!(Isa::parse("sse2"), None);
        assert!(Isa::Scalar < Isa::Avx2 && Isa::Avx2 < Isa::Avx512);
        // A request is never above what the CPU has.
        assert!(Isa::Avx512.clamp() <= Isa::detected());
        assert_eq!(Isa::Scalar.clamp(), Isa::Scalar);
    }
}
