//! What a GPU backend's memory pool held while a stage ran: the largest number of bytes in live
//! allocations and the largest number reserved from the device, sampled at points the stage
//! chooses (after each optimizer step, every few decode steps).
//!
//! burn's CubeCL backends allocate from pages that grow to the largest allocation seen and are
//! given back only under memory pressure, so what the device shows as used (`nvidia-smi`) is the
//! pool's reservation, not what the step needs. The two figures side by side say which of them a
//! large footprint is. The CPU backend has no pool: [`PoolWatch::new`] is `None` there, and no
//! line is printed.
use burn::tensor::Device;

/// The peaks over the samples taken so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolPeak {
    /// Largest sum of the live allocations' sizes (padding excluded).
    pub in_use: u64,
    /// Largest number of bytes the pool held on the device (in use, padding and free pages).
    pub reserved: u64,
    /// Largest number of live allocations.
    pub allocations: u64,
    /// Samples taken.
    pub samples: u64,
}

impl PoolPeak {
    /// Fold one reading in.
    pub fn add(&mut self, in_use: u64, reserved: u64, allocations: u64) {
        self.in_use = self.in_use.max(in_use);
        self.reserved = self.reserved.max(reserved);
        self.allocations = self.allocations.max(allocations);
        self.samples += 1;
    }

    /// `STAGE: GPU memory pool: peak X MiB in use, Y MiB reserved (N live allocations at most,
    /// S samples)`.
    pub fn line(&self, stage: &str) -> String {
        format!(
            "{stage}: GPU memory pool: peak {} in use, {} reserved ({} live allocations at most, \
             {} samples)",
            mib(self.in_use),
            mib(self.reserved),
            self.allocations,
            self.samples
        )
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// Samples one device's pool; see the module documentation.
#[derive(Debug, Clone)]
pub struct PoolWatch {
    device: Device,
    peak: PoolPeak,
}

impl PoolWatch {
    /// A watch on `device`'s pool, or `None` where the backend reports none (the CPU).
    pub fn new(device: &Device) -> Option<Self> {
        device.memory_pool_usage()?;
        let mut w = Self {
            device: device.clone(),
            peak: PoolPeak::default(),
        };
        w.sample();
        Some(w)
    }

    /// Read the pool now and keep the peaks. A reading the backend cannot give (a failed stream)
    /// is skipped.
    pub fn sample(&mut self) {
        if let Some(u) = self.device.memory_pool_usage() {
            self.peak
                .add(u.bytes_in_use, u.bytes_reserved, u.number_allocs);
        }
    }

    /// The peaks so far.
    pub fn peak(&self) -> PoolPeak {
        self.peak
    }

    /// [`PoolPeak::line`] after one last sample.
    pub fn line(&mut self, stage: &str) -> String {
        self.sample();
        self.peak.line(stage)
    }
}

/// `watch`'s line, for a stage that may run on the CPU (`None` there).
pub fn line(watch: &mut Option<PoolWatch>, stage: &str) -> Option<String> {
    watch.as_mut().map(|w| w.line(stage))
}

/// Serialises the tests that read a GPU pool or allocate much from it: the pool is the
/// process's, so one such test's allocations would show in another's readings.
#[cfg(all(test, feature = "wgpu"))]
pub(crate) fn pool_test_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_has_no_pool_to_report() {
        assert!(PoolWatch::new(&Device::flex()).is_none());
    }

    /// A 4 MiB tensor on wgpu (`RLCR_WGPU_DEVICE`, default `wgpu`: lavapipe in CI) shows in the
    /// pool's bytes in use while it lives, and the peak keeps it after it is dropped. (The pool is
    /// the process's: other tests' tensors come and go in the same readings, so the reading while
    /// the tensor lives is bounded from below by its size, not compared with the reading before.)
    #[cfg(feature = "wgpu")]
    #[test]
    fn gpu_devices_report_their_pool() {
        let _pool = pool_test_lock();
        let spec = std::env::var("RLCR_WGPU_DEVICE").unwrap_or_else(|_| "wgpu".into());
        let device = spec
            .parse::<crate::model::DeviceSpec>()
            .unwrap()
            .open()
            .unwrap();
        let mut w = PoolWatch::new(&device).expect("wgpu reports its pool");
        let x = burn::tensor::Tensor::<1>::ones([1 << 20], &device);
        let _ = crate::model::read_f32(x.clone().narrow(0, 0, 1)).unwrap();
        w.sample();
        let held = w.peak();
        assert!(held.in_use >= 4 << 20, "{held:?}");
        assert!(held.reserved >= held.in_use);
        drop(x);
        w.sample();
        assert_eq!(w.peak().in_use, held.in_use, "a peak is not lowered");
        assert_eq!(w.peak().samples, held.samples + 1);
    }

    #[test]
    fn peaks_are_the_largest_reading_of_each_figure() {
        let mut p = PoolPeak::default();
        p.add(10 << 20, 64 << 20, 7);
        p.add(30 << 20, 48 << 20, 3);
        p.add(5 << 20, 96 << 20, 5);
        assert_eq!(
            p,
            PoolPeak {
                in_use: 30 << 20,
                reserved: 96 << 20,
                allocations: 7,
                samples: 3
            }
        );
        assert_eq!(
            p.line("update"),
            "update: GPU memory pool: peak 30.0 MiB in use, 96.0 MiB reserved (7 live \
             allocations at most, 3 samples)"
        );
    }
}
