//! The driver's PRNG (xoshiro256**) and pgbench's random distributions.
//! Owned and copyable, so a retried transaction replays the same values, as
//! pgbench does.

#[derive(Debug, Clone, Copy)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn seeded(seed: u64) -> Rng {
        // SplitMix64 to spread the seed over the state.
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng {
            s: [next(), next(), next(), next()],
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    pub fn double(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform integer in [lb, ub] (inclusive), without modulo bias.
    pub fn uniform(&mut self, lb: i64, ub: i64) -> i64 {
        let range = (ub as i128 - lb as i128) as u128 as u64; // ub >= lb checked by the caller
        if range == u64::MAX {
            return self.next_u64() as i64;
        }
        let n = range + 1;
        let zone = u64::MAX - (u64::MAX % n);
        loop {
            let v = self.next_u64();
            if v < zone {
                return (lb as i128 + (v % n) as i128) as i64;
            }
        }
    }

    /// pgbench's random_exponential: `parameter` > 0.
    pub fn exponential(&mut self, lb: i64, ub: i64, parameter: f64) -> i64 {
        let cut = (-parameter).exp();
        let uniform = 1.0 - self.double(); // (0, 1]
        let rand = -(cut + (1.0 - cut) * uniform).ln() / parameter;
        lb + (((ub - lb + 1) as f64) * rand) as i64
    }

    /// pgbench's random_gaussian: `parameter` >= 2, values beyond ±parameter
    /// standard deviations are redrawn.
    pub fn gaussian(&mut self, lb: i64, ub: i64, parameter: f64) -> i64 {
        let stdev = loop {
            let r1 = 1.0 - self.double();
            let r2 = 1.0 - self.double();
            let s = (-2.0 * r1.ln()).sqrt() * (2.0 * std::f64::consts::PI * r2).sin();
            if s >= -parameter && s < parameter {
                break s;
            }
        };
        let rand = (stdev + parameter) / (parameter * 2.0);
        lb + (((ub - lb + 1) as f64) * rand) as i64
    }

    /// pgbench's random_zipfian (Devroye's rejection method): 1.001 <= s <= 1000.
    pub fn zipfian(&mut self, lb: i64, ub: i64, s: f64) -> i64 {
        let n = (ub - lb + 1) as f64;
        let b = 2f64.powf(s - 1.0);
        let x = loop {
            let u = 1.0 - self.double();
            let v = self.double();
            let x = u.powf(-1.0 / (s - 1.0)).floor();
            let t = (1.0 + 1.0 / x).powf(s - 1.0);
            if v * x * (t - 1.0) / (b - 1.0) <= t / b && x <= n {
                break x;
            }
        };
        lb + x as i64 - 1
    }
}

const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const MM2_MUL: u64 = 0xc6a4_a793_5bd1_e995;
const MM2_MUL_TIMES_8: u64 = 0x3525_3c9a_de8f_4ca8;
const MM2_ROT: u32 = 47;

/// pgbench's hash_fnv1a(value, seed).
pub fn hash_fnv1a(val: i64, seed: u64) -> i64 {
    let mut result = FNV_OFFSET_BASIS ^ seed;
    let mut v = val;
    for _ in 0..8 {
        let octet = (v & 0xff) as u64;
        v >>= 8;
        result ^= octet;
        result = result.wrapping_mul(FNV_PRIME);
    }
    result as i64
}

/// pgbench's hash_murmur2(value, seed) (also `hash`).
pub fn hash_murmur2(val: i64, seed: u64) -> i64 {
    let mut result = seed ^ MM2_MUL_TIMES_8;
    let mut k = val as u64;
    k = k.wrapping_mul(MM2_MUL);
    k ^= k >> MM2_ROT;
    k = k.wrapping_mul(MM2_MUL);
    result ^= k;
    result = result.wrapping_mul(MM2_MUL);
    result ^= result >> MM2_ROT;
    result = result.wrapping_mul(MM2_MUL);
    result ^= result >> MM2_ROT;
    result as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_is_inclusive_and_covers_the_range() {
        let mut r = Rng::seeded(1);
        let mut seen = [false; 6];
        for _ in 0..10_000 {
            let v = r.uniform(-2, 3);
            assert!((-2..=3).contains(&v));
            seen[(v + 2) as usize] = true;
        }
        assert!(seen.iter().all(|s| *s));
        assert_eq!(r.uniform(7, 7), 7);
        let v = r.uniform(i64::MIN, i64::MAX);
        let _ = v;
    }

    #[test]
    fn distributions_stay_in_range_and_skew_as_documented() {
        let mut r = Rng::seeded(42);
        let n = 100_000;
        let (mut low_exp, mut mid_gauss, mut first_zipf) = (0, 0, 0);
        for _ in 0..n {
            let e = r.exponential(1, 100, 5.0);
            assert!((1..=100).contains(&e));
            if e <= 10 {
                low_exp += 1;
            }
            let g = r.gaussian(1, 100, 2.5);
            assert!((1..=100).contains(&g));
            if (41..=60).contains(&g) {
                mid_gauss += 1;
            }
            let z = r.zipfian(1, 100, 1.5);
            assert!((1..=100).contains(&z));
            if z == 1 {
                first_zipf += 1;
            }
        }
        // Exponential with parameter 5: P(x <= 10 %) = (1 - e^-0.5) / (1 - e^-5) ~ 0.395.
        let p = low_exp as f64 / n as f64;
        assert!((0.37..0.42).contains(&p), "{p}");
        // Gaussian with parameter 2.5: the middle 20 % holds far more than 20 %.
        assert!(mid_gauss as f64 / n as f64 > 0.35);
        // Zipfian s=1.5 over 100: the first value is the most frequent by far (~0.4).
        assert!(first_zipf as f64 / n as f64 > 0.3);
    }

    #[test]
    fn hashes_are_deterministic_and_seeded() {
        assert_eq!(hash_fnv1a(1, 0), hash_fnv1a(1, 0));
        assert_ne!(hash_fnv1a(1, 0), hash_fnv1a(1, 1));
        assert_ne!(hash_murmur2(1, 0), hash_murmur2(2, 0));
        // FNV-1a of eight zero octets from the offset basis.
        let mut h = FNV_OFFSET_BASIS;
        for _ in 0..8 {
            h = h.wrapping_mul(FNV_PRIME);
        }
        assert_eq!(hash_fnv1a(0, 0), h as i64);
    }
}
