//! Picking the next token from logits: greedy, temperature, top-p (nucleus, Holtzman et al. 2019),
//! as llama2.c's run.c `sample` does, with a seeded ChaCha RNG.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::{Error, Result};

/// The smallest positive temperature: below it, logits / temperature overflows f32 for logits of
/// ordinary size (a logit of 40 over 1e-38 is infinite), and sampling is greedy in all but name.
pub const MIN_TEMPERATURE: f32 = 1e-3;
/// The largest temperature: above it every distribution is uniform to f32 precision.
pub const MAX_TEMPERATURE: f32 = 100.0;

/// Checks a sampling temperature: 0 (greedy) or a finite value in
/// [`MIN_TEMPERATURE`, `MAX_TEMPERATURE`].
///
/// # Errors
/// [`Error::Sampling`] naming the valid range.
pub fn check_temperature(t: f32) -> Result<f32> {
    if t == 0.0 || (MIN_TEMPERATURE..=MAX_TEMPERATURE).contains(&t) {
        Ok(t)
    } else {
        Err(Error::Sampling(format!(
            "temperature {t:?} is out of range: use 0 (greedy) or a value from {MIN_TEMPERATURE} to {MAX_TEMPERATURE}"
        )))
    }
}

/// Checks a nucleus (top-p) threshold: a finite value in (0, 1]; 1 disables it.
///
/// # Errors
/// [`Error::Sampling`] naming the valid range.
pub fn check_top_p(p: f32) -> Result<f32> {
    if p > 0.0 && p <= 1.0 {
        Ok(p)
    } else {
        Err(Error::Sampling(format!(
            "top-p {p:?} is out of range: use a value greater than 0 and at most 1 (1 disables nucleus sampling)"
        )))
    }
}

/// Checks a min-p threshold: 0 (off) to 1.
///
/// # Errors
/// [`Error::Sampling`] naming the valid range.
pub fn check_min_p(p: f32) -> Result<f32> {
    if (0.0..=1.0).contains(&p) {
        Ok(p)
    } else {
        Err(Error::Sampling(format!(
            "min-p {p:?} is out of range: use a value from 0 (off) to 1"
        )))
    }
}

/// Checks a repeat penalty: from 1/[`MAX_REPEAT_PENALTY`] to [`MAX_REPEAT_PENALTY`]; 1 is off.
/// The lower bound keeps `logit / penalty` finite: a penalty near 0 would turn a seen token's
/// logit into infinity and the sampler would pick it for a meaningless reason.
///
/// # Errors
/// [`Error::Sampling`] naming the valid range.
pub fn check_repeat_penalty(r: f32) -> Result<f32> {
    if (1.0 / MAX_REPEAT_PENALTY..=MAX_REPEAT_PENALTY).contains(&r) {
        Ok(r)
    } else {
        Err(Error::Sampling(format!(
            "repeat penalty {r:?} is out of range: use a value from {} to {MAX_REPEAT_PENALTY} (1 is off)",
            1.0 / MAX_REPEAT_PENALTY
        )))
    }
}

/// A logit that is NaN or infinite: the model's arithmetic broke down (NaN weights, an
/// overflow), so no token can be chosen from it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NonFiniteLogit {
    /// Its index (token id) in the logits.
    pub index: usize,
    /// The logit: NaN or ±infinity.
    pub value: f32,
}

/// Turns logits into a token id.
#[derive(Clone, Debug)]
pub struct Sampler {
    /// 0 means greedy.
    temperature: f32,
    /// Nucleus threshold in (0, 1]; 1 means plain multinomial sampling.
    top_p: f32,
    /// Keep only the k most likely tokens before sampling; 0 keeps all (llama.cpp's --top-k).
    top_k: usize,
    /// Drop tokens whose probability is below min_p × the top probability; 0 keeps all
    /// (llama.cpp's --min-p).
    min_p: f32,
    /// Divide positive (multiply negative) logits of recently seen tokens by this; 1 is off
    /// (llama.cpp's --repeat-penalty, CTRL's penalty, Keskar et al. 2019).
    repeat_penalty: f32,
    /// The last `REPEAT_LAST_N` tokens seen (prompt and output), oldest first.
    recent: std::collections::VecDeque<u32>,
    rng: ChaCha8Rng,
}

/// Tokens the repeat penalty looks back over (llama.cpp's default --repeat-last-n).
pub const REPEAT_LAST_N: usize = 64;
/// The largest repeat penalty accepted.
pub const MAX_REPEAT_PENALTY: f32 = 10.0;

impl Sampler {
    /// A sampler with a seeded RNG.
    ///
    /// # Errors
    /// [`Error::Sampling`] for a temperature or top-p outside the ranges of [`check_temperature`]
    /// and [`check_top_p`].
    pub fn new(temperature: f32, top_p: f32, seed: u64) -> Result<Sampler> {
        Ok(Sampler {
            temperature: check_temperature(temperature)?,
            top_p: check_top_p(top_p)?,
            ..Sampler::seeded(0.0, 1.0, seed)
        })
    }

    fn seeded(temperature: f32, top_p: f32, seed: u64) -> Sampler {
        Sampler {
            temperature,
            top_p,
            top_k: 0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            recent: std::collections::VecDeque::with_capacity(REPEAT_LAST_N),
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    /// Keeps only the `k` most likely tokens (0: all).
    pub fn with_top_k(mut self, k: usize) -> Sampler {
        self.top_k = k;
        self
    }

    /// Drops tokens below `min_p` × the top probability.
    ///
    /// # Errors
    /// [`Error::Sampling`] unless 0 ≤ min_p ≤ 1.
    pub fn with_min_p(mut self, min_p: f32) -> Result<Sampler> {
        self.min_p = check_min_p(min_p)?;
        Ok(self)
    }

    /// Penalises the last [`REPEAT_LAST_N`] tokens seen (see [`Sampler::accept`]); a penalty
    /// below 1 favours repeats, as llama.cpp allows.
    ///
    /// # Errors
    /// [`Error::Sampling`] unless 0 < penalty ≤ [`MAX_REPEAT_PENALTY`].
    pub fn with_repeat_penalty(mut self, penalty: f32) -> Result<Sampler> {
        self.repeat_penalty = check_repeat_penalty(penalty)?;
        Ok(self)
    }

    /// Records a token as seen, for the repeat penalty: the generate loop passes every prompt
    /// token and every token it samples.
    pub fn accept(&mut self, token: u32) {
        if self.recent.len() == REPEAT_LAST_N {
            self.recent.pop_front();
        }
        self.recent.push_back(token);
    }

    /// Whether it picks deterministically (temperature 0: the argmax, after any repeat penalty).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// The deterministic sampler: argmax, ties to the lowest id.
    pub fn greedy() -> Sampler {
        Sampler::seeded(0.0, 1.0, 0)
    }

    /// The token after position `pos`, from its logits: [`Sampler::sample`], recorded with
    /// [`Sampler::accept`]. What every generate loop does once per step.
    ///
    /// # Errors
    /// [`crate::Error::NonFiniteLogits`] naming `pos` and the first bad logit.
    pub fn next_token(&mut self, logits: &mut [f32], pos: usize) -> crate::Result<u32> {
        let next = self
            .sample(logits)
            .map_err(|e| crate::Error::NonFiniteLogits {
                pos,
                index: e.index,
                value: e.value,
            })?;
        self.accept(next);
        Ok(next)
    }

    /// Samples one token. `logits` is scratch: it is overwritten with probabilities.
    ///
    /// # Errors
    /// The first logit that is NaN or infinite (greedy decoding included: an argmax over NaN
    /// would silently pick token 0).
    pub fn sample(&mut self, logits: &mut [f32]) -> Result<u32, NonFiniteLogit> {
        if let Some(greedy) = self.shape(logits)? {
            return Ok(greedy);
        }
        let coin: f32 = self.rng.random();
        Ok(if self.top_p >= 1.0 {
            sample_multinomial(logits, coin)
        } else {
            sample_top_p(logits, self.top_p, coin)
        })
    }

    /// The distribution [`Sampler::sample`] draws from, written over `logits`: one-hot at the
    /// argmax when greedy; otherwise the probabilities after the repeat penalty, top-k,
    /// temperature and min-p, cut to the top-p nucleus (the most likely tokens, ties to the
    /// lowest id, until their sum exceeds top-p) and renormalized. Speculative sampling checks
    /// guesses against it.
    ///
    /// # Errors
    /// As [`Sampler::sample`].
    pub fn distribution(&self, logits: &mut [f32]) -> Result<(), NonFiniteLogit> {
        if let Some(greedy) = self.shape(logits)? {
            logits.fill(0.0);
            logits[greedy as usize] = 1.0;
            return Ok(());
        }
        if self.top_p < 1.0 {
            let keep = nucleus(logits, self.top_p);
            let mut mask = vec![false; logits.len()];
            for id in keep {
                mask[id as usize] = true;
            }
            let mut sum = 0.0;
            for (p, keep) in logits.iter_mut().zip(mask) {
                if !keep {
                    *p = 0.0;
                }
                sum += *p;
            }
            for p in logits.iter_mut() {
                *p /= sum;
            }
        }
        Ok(())
    }

    /// Draws a token from `probs` (summing to 1) with the sampler's generator.
    pub fn draw(&mut self, probs: &[f32]) -> u32 {
        let coin: f32 = self.rng.random();
        let sum: f32 = probs.iter().sum();
        sample_multinomial(probs, coin * sum)
    }

    /// A uniform number in [0, 1) from the sampler's generator.
    pub fn coin(&mut self) -> f32 {
        self.rng.random()
    }

    /// Checks `logits` and applies the penalty, top-k, temperature and min-p in place: the
    /// greedy token when the sampler is greedy, else `None` with `logits` now probabilities.
    fn shape(&self, logits: &mut [f32]) -> Result<Option<u32>, NonFiniteLogit> {
        let non_finite = |logits: &[f32]| {
            let (index, &value) = logits
                .iter()
                .enumerate()
                .find(|(_, v)| !v.is_finite())
                .unwrap_or((0, &f32::NAN));
            NonFiniteLogit { index, value }
        };
        // One pass for the check and the maximum: greedy with nothing to change first needs no
        // other.
        let (max, finite) = max_and_finite(logits);
        if !finite {
            return Err(non_finite(logits));
        }
        if self.temperature == 0.0 && self.repeat_penalty == 1.0 {
            return Ok(Some(first_index_of(logits, max)));
        }
        if self.repeat_penalty != 1.0 {
            // CTRL's penalty as llama.cpp applies it: once per distinct recent token.
            let mut seen = self.recent.iter().copied().collect::<Vec<_>>();
            seen.sort_unstable();
            seen.dedup();
            for t in seen {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l > 0.0 {
                        *l / self.repeat_penalty
                    } else {
                        *l * self.repeat_penalty
                    };
                }
            }
        }
        if self.temperature == 0.0 {
            return Ok(Some(argmax(logits)));
        }
        if self.top_k > 0 && self.top_k < logits.len() {
            // The k-th largest logit; everything below it is out (ties at the threshold stay).
            let mut sorted = logits.to_vec();
            let k = self.top_k;
            sorted.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
            let kth = sorted[k - 1];
            for l in logits.iter_mut() {
                if *l < kth {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        // softmax(x / T) = softmax((x − max x) / T): subtracting the maximum first keeps every
        // exponent ≤ 0, so no temperature in range can overflow.
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        for l in logits.iter_mut() {
            *l = (*l - max) / self.temperature;
        }
        softmax_in_place(logits);
        if self.min_p > 0.0 {
            // After softmax the top probability is exp(0) / Σ: drop p < min_p · p_max, rescale.
            let cut = self.min_p * logits.iter().copied().fold(0.0, f32::max);
            let mut sum = 0.0;
            for p in logits.iter_mut() {
                if *p < cut {
                    *p = 0.0;
                }
                sum += *p;
            }
            for p in logits.iter_mut() {
                *p /= sum;
            }
        }
        Ok(None)
    }
}

/// Index of the largest value; the lowest index wins ties; NaN never wins (all NaN: 0).
///
/// Two passes a compiler vectorizes: the maximum over 16 independent lanes (a comparison with
/// NaN is false, so NaN never enters a lane), then the first index holding it, 16 values at a
/// time. Both are compiled again for AVX2 and AVX-512 and picked at run time, since this crate
/// is built for baseline x86-64, whose SSE2 has 4 lanes. Measured with `cargo bench -p
/// kvlab-benches --bench sampler` (64 rows of 32,000 logits, what a server step samples):
/// * on this project's 2-core Xeon, one row took 11 µs against 39–42 µs for one branchy pass
///   (`argmax_reference` in the tests);
/// * on its 2-core AMD EPYC, the greedy [`Sampler::sample`] went from 8.4 to 4.3 µs a row when
///   the finite check joined the maximum's pass and the passes got their AVX-512 build.
pub fn argmax(x: &[f32]) -> u32 {
    let (max, _) = max_and_finite(x);
    first_index_of(x, max)
}

/// Lanes of the passes below: one AVX-512 register of f32, or two of AVX2.
const LANES: usize = 16;

/// The largest value (NaN never counted; −∞ for none) and whether every value is finite, in one
/// pass: the greedy pick's check and maximum read the row once.
fn max_and_finite(x: &[f32]) -> (f32, bool) {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F, the only feature the function is compiled for.
            return unsafe { max_and_finite_avx512(x) };
        }
        if is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2, the only feature the function is compiled for.
            return unsafe { max_and_finite_avx2(x) };
        }
    }
    max_and_finite_lanes(x)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn max_and_finite_avx512(x: &[f32]) -> (f32, bool) {
    max_and_finite_lanes(x)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn max_and_finite_avx2(x: &[f32]) -> (f32, bool) {
    max_and_finite_lanes(x)
}

/// The portable body, inlined into each feature level. `v · 0` is 0 for a finite `v` and NaN
/// for ±∞ or NaN, and a NaN in a lane's sum stays there: the check is a multiply-add per value,
/// with no branch to stop the loop vectorizing.
#[inline(always)]
fn max_and_finite_lanes(x: &[f32]) -> (f32, bool) {
    let mut max = [f32::NEG_INFINITY; LANES];
    let mut zero = [0.0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for ((m, z), &v) in max.iter_mut().zip(&mut zero).zip(c) {
            *m = if v > *m { v } else { *m };
            *z += v * 0.0;
        }
    }
    let mut m = f32::NEG_INFINITY;
    let mut z = 0.0f32;
    for &v in max.iter().chain(tail) {
        m = if v > m { v } else { m };
    }
    for &v in zero.iter() {
        z += v;
    }
    for &v in tail {
        z += v * 0.0;
    }
    (m, z == 0.0)
}

/// The first index holding `value` (0 if none), comparing 16 values at a time.
fn first_index_of(x: &[f32], value: f32) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F, the only feature the function is compiled for.
            return unsafe { first_index_of_avx512(x, value) };
        }
        if is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2, the only feature the function is compiled for.
            return unsafe { first_index_of_avx2(x, value) };
        }
    }
    first_index_of_lanes(x, value)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn first_index_of_avx512(x: &[f32], value: f32) -> u32 {
    first_index_of_lanes(x, value)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn first_index_of_avx2(x: &[f32], value: f32) -> u32 {
    first_index_of_lanes(x, value)
}

/// The portable body: a whole chunk is compared (no early exit inside it, so it vectorizes)
/// and only the chunk that holds `value` is searched.
#[inline(always)]
fn first_index_of_lanes(x: &[f32], value: f32) -> u32 {
    let chunks = x.chunks_exact(LANES);
    let tail_start = x.len() - chunks.remainder().len();
    for (i, c) in chunks.enumerate() {
        if c.iter().fold(false, |hit, &v| hit | (v == value)) {
            let j = c.iter().position(|&v| v == value).unwrap_or(0);
            return (i * LANES + j) as u32;
        }
    }
    x[tail_start..]
        .iter()
        .position(|&v| v == value)
        .map_or(0, |j| (tail_start + j) as u32)
}

/// The largest and second-largest values' difference: how close greedy decoding is to a tie.
pub fn top2_margin(x: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in x {
        if v > a {
            b = a;
            a = v;
        } else if v > b {
            b = v;
        }
    }
    a - b
}

/// softmax(x)_i = exp(x_i − max x) / Σ_j exp(x_j − max x)
pub fn softmax_in_place(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}

fn sample_multinomial(probs: &[f32], coin: f32) -> u32 {
    let mut cdf = 0.0;
    for (i, &p) in probs.iter().enumerate() {
        cdf += p;
        if coin < cdf {
            return i as u32;
        }
    }
    (probs.len() - 1) as u32
}

/// The top-p nucleus of `probs`: the most likely tokens (ties to the lowest id) up to and
/// including the one whose cumulative probability first exceeds `top_p`, with that sum. Tokens
/// below (1 − top_p)/(n − 1) cannot be in the nucleus and are skipped before sorting, as run.c
/// does.
fn nucleus_with_sum(probs: &[f32], top_p: f32) -> (Vec<(u32, f32)>, f32) {
    let cutoff = (1.0 - top_p) / (probs.len().max(2) - 1) as f32;
    let mut cand: Vec<(u32, f32)> = probs
        .iter()
        .enumerate()
        .filter(|(_, p)| **p >= cutoff)
        .map(|(i, &p)| (i as u32, p))
        .collect();
    cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut cum = 0.0;
    let mut last = cand.len().saturating_sub(1);
    for (i, &(_, p)) in cand.iter().enumerate() {
        cum += p;
        if cum > top_p {
            last = i;
            break;
        }
    }
    cand.truncate(last + 1);
    (cand, cum)
}

/// The token ids of the top-p nucleus of `probs` ([`nucleus_with_sum`]).
fn nucleus(probs: &[f32], top_p: f32) -> Vec<u32> {
    nucleus_with_sum(probs, top_p)
        .0
        .into_iter()
        .map(|c| c.0)
        .collect()
}

/// Samples from the smallest set of most likely tokens whose probability exceeds `top_p`.
fn sample_top_p(probs: &[f32], top_p: f32, coin: f32) -> u32 {
    let (cand, cum) = nucleus_with_sum(probs, top_p);
    let last = cand.len().saturating_sub(1);
    let r = coin * cum;
    let mut cdf = 0.0;
    for &(id, p) in cand.iter().take(last + 1) {
        cdf += p;
        if r < cdf {
            return id;
        }
    }
    cand.get(last).map_or(0, |c| c.0)
}

#[cfg(test)]
mod tests {
    /// The plain argmax: one pass, the first strict maximum, NaN replaced by anything else.
    fn argmax_reference(x: &[f32]) -> u32 {
        let mut best = 0;
        for (i, &v) in x.iter().enumerate() {
            if v > x[best] || x[best].is_nan() && !v.is_nan() {
                best = i;
            }
        }
        best as u32
    }

    proptest::proptest! {
        /// Random rows with ties, NaN, infinities and every length around the lane width.
        #[test]
        fn argmax_equals_the_reference(
            x in proptest::collection::vec(
                proptest::prop_oneof![
                    8 => -4i8..4i8,
                    1 => proptest::strategy::Just(i8::MIN),
                    1 => proptest::strategy::Just(i8::MAX),
                    1 => proptest::strategy::Just(0i8),
                ],
                0..70,
            ),
            nan_at in proptest::collection::vec(0usize..70, 0..4),
        ) {
            let mut v: Vec<f32> = x
                .iter()
                .map(|&i| match i {
                    i8::MIN => f32::NEG_INFINITY,
                    i8::MAX => f32::INFINITY,
                    i => f32::from(i) * 0.5,
                })
                .collect();
            for &i in &nan_at {
                if let Some(e) = v.get_mut(i) {
                    *e = f32::NAN;
                }
            }
            let want = argmax_reference(&v);
            let finite = v.iter().all(|e| e.is_finite());
            proptest::prop_assert_eq!(argmax(&v), want, "{:?}", v);
            for (level, pass) in max_and_finite_levels() {
                let (max, all) = pass(&v);
                proptest::prop_assert_eq!(all, finite, "{} on {:?}", level, v);
                let reference_max = v.iter().copied().filter(|e| !e.is_nan()).fold(f32::NEG_INFINITY, f32::max);
                proptest::prop_assert_eq!(max.to_bits(), reference_max.to_bits(), "{} on {:?}", level, v);
            }
            for (level, find) in first_index_levels() {
                let max = v.get(want as usize).copied().unwrap_or(f32::NAN);
                if !max.is_nan() {
                    proptest::prop_assert_eq!(find(&v, max), want, "{} on {:?}", level, v);
                }
            }
            let greedy = Sampler::greedy().sample(&mut v.clone());
            if finite {
                proptest::prop_assert_eq!(greedy, Ok(want));
            } else {
                let bad = v.iter().position(|e| !e.is_finite()).unwrap_or(0);
                proptest::prop_assert_eq!(greedy.map_err(|e| e.index), Err(bad));
            }
        }
    }

    type MaxAndFinite = Box<dyn Fn(&[f32]) -> (f32, bool)>;
    type FirstIndex = Box<dyn Fn(&[f32], f32) -> u32>;

    /// Every compiled level of the fused pass this CPU can run: the portable body always.
    fn max_and_finite_levels() -> Vec<(&'static str, MaxAndFinite)> {
        let mut levels: Vec<(&'static str, MaxAndFinite)> =
            vec![("portable", Box::new(max_and_finite_lanes))];
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") {
                // SAFETY: AVX2 is present.
                levels.push(("avx2", Box::new(|x| unsafe { max_and_finite_avx2(x) })));
            }
            if is_x86_feature_detected!("avx512f") {
                // SAFETY: AVX-512F is present.
                levels.push(("avx512", Box::new(|x| unsafe { max_and_finite_avx512(x) })));
            }
        }
        levels
    }

    /// Every compiled level of the index search this CPU can run.
    fn first_index_levels() -> Vec<(&'static str, FirstIndex)> {
        let mut levels: Vec<(&'static str, FirstIndex)> =
            vec![("portable", Box::new(first_index_of_lanes))];
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") {
                // SAFETY: AVX2 is present.
                levels.push((
                    "avx2",
                    Box::new(|x, v| unsafe { first_index_of_avx2(x, v) }),
                ));
            }
            if is_x86_feature_detected!("avx512f") {
                // SAFETY: AVX-512F is present.
                levels.push((
                    "avx512",
                    Box::new(|x, v| unsafe { first_index_of_avx512(x, v) }),
                ));
            }
        }
        levels
    }

    #[test]
    fn argmax_of_all_nan_is_0() {
        assert_eq!(argmax(&[f32::NAN; 20]), 0);
        assert_eq!(argmax(&[]), 0);
    }

    use super::*;

    #[test]
    fn argmax_ties_go_to_the_lowest_id() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5, 0.5]), 1);
    }

    #[test]
    fn greedy_ignores_the_seed() {
        let mut l = vec![0.1, 0.9, 0.3];
        assert_eq!(Sampler::greedy().sample(&mut l.clone()), Ok(1));
        assert_eq!(Sampler::new(0.0, 0.9, 7).unwrap().sample(&mut l), Ok(1));
    }

    #[test]
    fn the_distribution_is_what_sample_draws_from() {
        let logits: Vec<f32> = (0..40).map(|i| ((i * 37) % 23) as f32 * 0.3).collect();
        for (t, top_p, top_k, min_p) in
            [(1.0, 1.0, 0, 0.0), (0.7, 0.5, 0, 0.0), (1.3, 0.9, 5, 0.05)]
        {
            let sampler = Sampler::new(t, top_p, 0)
                .unwrap()
                .with_top_k(top_k)
                .with_min_p(min_p)
                .unwrap();
            let mut p = logits.clone();
            sampler.distribution(&mut p).unwrap();
            assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-5);
            for seed in 0..300 {
                let mut s = sampler.clone();
                s.rng = ChaCha8Rng::seed_from_u64(seed);
                let t = s.sample(&mut logits.clone()).unwrap();
                assert!(p[t as usize] > 0.0, "drew {t} outside the distribution");
            }
        }
        let mut one_hot = logits.clone();
        Sampler::greedy().distribution(&mut one_hot).unwrap();
        assert_eq!(one_hot[argmax(&logits) as usize], 1.0);
        assert_eq!(one_hot.iter().sum::<f32>(), 1.0);
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_respects_top_p() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let run = |seed| {
            let mut s = Sampler::new(1.0, 0.5, seed).unwrap();
            (0..20)
                .map(|_| s.sample(&mut logits.clone()).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        // With top-p 0.5 only tokens in the nucleus can come out.
        let mut probs = logits.clone();
        softmax_in_place(&mut probs);
        let mut order: Vec<usize> = (0..50).collect();
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
        let mut cum = 0.0;
        let mut nucleus = Vec::new();
        for &i in &order {
            nucleus.push(i as u32);
            cum += probs[i];
            if cum > 0.5 {
                break;
            }
        }
        for t in run(3) {
            assert!(nucleus.contains(&t), "{t} outside the nucleus {nucleus:?}");
        }
    }

    #[test]
    fn top2_margin_measures_the_gap() {
        assert_eq!(top2_margin(&[1.0, 4.0, 2.5]), 1.5);
    }

    #[test]
    fn out_of_range_parameters_are_refused_with_the_range() {
        for t in [f32::NAN, f32::INFINITY, -1.0, 1e-38, 1e9] {
            let e = Sampler::new(t, 0.9, 0).unwrap_err().to_string();
            assert!(
                e.contains("use 0 (greedy) or a value from 0.001 to 100"),
                "{t}: {e}"
            );
        }
        for p in [f32::NAN, 0.0, -0.5, 1.5, f32::INFINITY] {
            let e = Sampler::new(1.0, p, 0).unwrap_err().to_string();
            assert!(e.contains("greater than 0 and at most 1"), "{p}: {e}");
        }
        for (t, p) in [(0.0, 1.0), (0.001, 0.01), (100.0, 1.0)] {
            assert!(Sampler::new(t, p, 0).is_ok(), "{t} {p}");
        }
    }

    #[test]
    fn non_finite_logits_are_an_error_for_every_sampler() {
        for (t, p) in [(0.0, 1.0), (1.0, 1.0), (0.8, 0.9)] {
            let mut s = Sampler::new(t, p, 1).unwrap();
            let e = s.sample(&mut [0.5, f32::NAN, 1.0]).unwrap_err();
            assert!(e.index == 1 && e.value.is_nan(), "{t} {p}: {e:?}");
            let e = s.sample(&mut [0.5, 1.0, f32::INFINITY]).unwrap_err();
            assert_eq!(
                e,
                NonFiniteLogit {
                    index: 2,
                    value: f32::INFINITY
                }
            );
        }
    }

    #[test]
    fn the_smallest_temperature_does_not_overflow() {
        // Logits of 40 over T = 0.001 would be 40,000 before the max is subtracted; softmax of
        // the shifted values is still a distribution and picks the maximum.
        let mut s = Sampler::new(MIN_TEMPERATURE, 1.0, 3).unwrap();
        for _ in 0..10 {
            assert_eq!(s.sample(&mut [40.0, 39.0, -40.0]), Ok(0));
        }
    }

    #[test]
    fn top_k_one_is_greedy_and_min_p_one_keeps_only_the_top() {
        let logits = [0.3, 2.0, 1.9, -1.0];
        for seed in 0..20 {
            let mut k1 = Sampler::new(1.0, 1.0, seed).unwrap().with_top_k(1);
            assert_eq!(k1.sample(&mut logits.clone()), Ok(1));
            let mut m1 = Sampler::new(1.0, 1.0, seed)
                .unwrap()
                .with_min_p(1.0)
                .unwrap();
            assert_eq!(m1.sample(&mut logits.clone()), Ok(1));
            // top-k 2 never picks outside the two largest.
            let mut k2 = Sampler::new(5.0, 1.0, seed).unwrap().with_top_k(2);
            assert!(matches!(k2.sample(&mut logits.clone()), Ok(1 | 2)));
        }
        assert!(Sampler::greedy().with_min_p(1.5).is_err());
        assert!(Sampler::greedy().with_repeat_penalty(0.0).is_err());
        assert!(Sampler::greedy().with_repeat_penalty(1e-38).is_err());
        assert!(Sampler::greedy().with_repeat_penalty(0.1).is_ok());
    }

    #[test]
    fn repeat_penalty_turns_greedy_away_from_a_seen_token() {
        let logits = [0.0, 2.0, 1.9];
        let mut s = Sampler::greedy().with_repeat_penalty(1.5).unwrap();
        assert_eq!(s.sample(&mut logits.clone()), Ok(1));
        s.accept(1);
        // 2.0 / 1.5 = 1.33 < 1.9: token 2 wins once token 1 was seen.
        assert_eq!(s.sample(&mut logits.clone()), Ok(2));
    }
}
