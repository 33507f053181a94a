//! pgbench's pseudo-random numbers, drawn exactly as pgbench 15+ draws
//! them: PostgreSQL's `pg_prng` (xoroshiro128** seeded through SplitMix64),
//! its bitmask-rejection ranges, and pgbench's distributions and
//! `permute`. With the same seed a client draws the values pgbench's client
//! draws (`Seeds` derives each client's generator as pgbench does). Owned
//! and copyable, so a retried transaction replays the same values, as
//! pgbench does.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rng {
    s0: u64,
    s1: u64,
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rng {
    /// `pg_prng_seed`.
    pub fn seeded(seed: u64) -> Rng {
        let mut x = seed;
        let (s0, s1) = (splitmix64(&mut x), splitmix64(&mut x));
        if s0 == 0 && s1 == 0 {
            // pg_prng_seed_check's replacement for the all-zero state.
            return Rng {
                s0: 0x5851_F42D_4C95_7F2D,
                s1: 0x1405_7B7E_F767_814F,
            };
        }
        Rng { s0, s1 }
    }

    /// xoroshiro128** (`pg_prng_uint64`).
    pub fn next_u64(&mut self) -> u64 {
        let s0 = self.s0;
        let sx = self.s1 ^ s0;
        let val = s0.wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        self.s0 = s0.rotate_left(24) ^ sx ^ (sx << 16);
        self.s1 = sx.rotate_left(37);
        val
    }

    /// Uniform in [0, 1) from 52 bits (`pg_prng_double`).
    pub fn double(&mut self) -> f64 {
        (self.next_u64() >> 12) as f64 * (1.0 / (1u64 << 52) as f64)
    }

    /// Uniform in [rmin, rmax] by bitmask rejection (`pg_prng_uint64_range`).
    pub fn range_u64(&mut self, rmin: u64, rmax: u64) -> u64 {
        if rmax <= rmin {
            return rmin;
        }
        let range = rmax - rmin;
        let shift = range.leading_zeros();
        loop {
            let v = self.next_u64() >> shift;
            if v <= range {
                return rmin + v;
            }
        }
    }

    /// Standard normal by Box-Muller (`pg_prng_double_normal`).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.double();
        let u2 = 1.0 - self.double();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).sin()
    }

    /// pgbench's `random(lb, ub)`: `lb + range(0, ub - lb)`; the caller
    /// checked lb <= ub and that the range fits.
    pub fn uniform(&mut self, lb: i64, ub: i64) -> i64 {
        lb.wrapping_add(self.range_u64(0, ub.wrapping_sub(lb) as u64) as i64)
    }

    /// pgbench's random_exponential: `parameter` > 0.
    pub fn exponential(&mut self, lb: i64, ub: i64, parameter: f64) -> i64 {
        let cut = (-parameter).exp();
        let uniform = 1.0 - self.double();
        let rand = -(cut + (1.0 - cut) * uniform).ln() / parameter;
        lb.wrapping_add((ub.wrapping_sub(lb).wrapping_add(1) as f64 * rand) as i64)
    }

    /// pgbench's random_gaussian: `parameter` >= 2, values beyond
    /// ±parameter standard deviations are redrawn.
    pub fn gaussian(&mut self, lb: i64, ub: i64, parameter: f64) -> i64 {
        let stdev = loop {
            let s = self.normal();
            if s >= -parameter && s < parameter {
                break s;
            }
        };
        let rand = (stdev + parameter) / (parameter * 2.0);
        lb.wrapping_add((ub.wrapping_sub(lb).wrapping_add(1) as f64 * rand) as i64)
    }

    /// pgbench's random_zipfian (Devroye's rejection method): 1.001 <= s <= 1000.
    pub fn zipfian(&mut self, lb: i64, ub: i64, s: f64) -> i64 {
        let n = ub.wrapping_sub(lb).wrapping_add(1);
        if n <= 1 {
            return lb;
        }
        let b = 2f64.powf(s - 1.0);
        let x = loop {
            let u = self.double();
            let v = self.double();
            let x = u.powf(-1.0 / (s - 1.0)).floor();
            let t = (1.0 + 1.0 / x).powf(s - 1.0);
            if v * x * (t - 1.0) / (b - 1.0) <= t / b && x <= n as f64 {
                break x;
            }
        };
        lb.wrapping_sub(1).wrapping_add(x as i64)
    }

    /// pgbench's Poisson-distributed `--rate` delays around `center`.
    pub fn poisson(&mut self, center: f64) -> i64 {
        let uniform = 1.0 - self.double();
        (-uniform.ln() * center + 0.5) as i64
    }
}

/// The generators pgbench derives from `--random-seed`: one base sequence
/// gives, in this order, each client's generator for script functions,
/// then `:default_seed`, then per thread the generators that choose a
/// script, throttle (`--rate`) and sample the log.
#[derive(Debug, Clone)]
pub struct Seeds {
    pub clients: Vec<Rng>,
    pub default_seed: i64,
    /// Per thread: (choose, throttle, sample).
    pub threads: Vec<(Rng, Rng, Rng)>,
}

impl Seeds {
    pub fn new(random_seed: u64, clients: usize, threads: usize) -> Seeds {
        let mut base = Rng::seeded(random_seed);
        let clients = (0..clients).map(|_| Rng::seeded(base.next_u64())).collect();
        let default_seed = base.next_u64() as i64;
        let threads = (0..threads)
            .map(|_| {
                let c = Rng::seeded(base.next_u64());
                let t = Rng::seeded(base.next_u64());
                let s = Rng::seeded(base.next_u64());
                (c, t, s)
            })
            .collect();
        Seeds {
            clients,
            default_seed,
            threads,
        }
    }
}

/// pgbench's `permute(val, size, seed)`: a pseudorandom permutation of
/// [0, size), six rounds of random multiply-xor-rotate over overlapping
/// halves and a random offset; `size` > 0 is checked by the caller.
pub fn permute(val: i64, isize: i64, seed: i64) -> i64 {
    if isize < 2 {
        return 0;
    }
    let mut rng = Rng::seeded(seed as u64);
    let size = isize as u64;
    let mut v = (val as u64) % size;
    let masklen = 63 - size.leading_zeros();
    let mask = (1u64 << masklen) - 1;
    let mix = |x: u64, m: u64, r: u64| -> u64 {
        let x = (x.wrapping_mul(m) ^ r) & mask;
        ((x << 1) & mask) | (x >> (masklen - 1))
    };
    for _ in 0..6 {
        let m = (rng.next_u64() & mask) | 1;
        let r = rng.next_u64() & mask;
        if v <= mask {
            v = mix(v, m, r);
        }
        let m = (rng.next_u64() & mask) | 1;
        let r = rng.next_u64() & mask;
        let t = size - 1 - v;
        if t <= mask {
            v = size - 1 - mix(t, m, r);
        }
        let r = rng.range_u64(0, size - 1);
        v = (v + r) % size;
    }
    v as i64
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
