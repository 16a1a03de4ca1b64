//! The generator of the sampling modules' test rows.

/// A 64-bit linear congruential generator (Knuth's MMIX constants): small, deterministic, and
/// the same sequence in every test that draws rows from it.
#[derive(Clone, Debug)]
pub(crate) struct Lcg(pub u64);

impl Lcg {
    /// Advances the state and returns it.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0
    }

    /// Advances the state; its top 24 bits as a value in `[0, 1)`.
    pub(crate) fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
}
