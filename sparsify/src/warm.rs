//! The warm start of the exact-count selectors ([`crate::ExactTopK`], [`crate::MsTopK`]):
//! the previous call's k-th magnitude, so that the next call on a tensor of the same shape
//! filters from just below it instead of estimating a threshold first.
//!
//! Error feedback calls a selector on the same tensor every iteration, and the k-th
//! magnitude of `residual + grad` moves little from one iteration to the next. A threshold
//! a relative margin below the last one replaces the strided sample (and, on small tensors,
//! the group-max pass and its second pass): one fused pass accumulates and emits the
//! candidates at or above it. The result stays exact: when at least `k` entries pass, the
//! k-th magnitude is at or above the threshold, so the whole top `k` is among the
//! candidates. When fewer pass, or too many, the caller falls back as after a misjudged
//! sample. The margin comes from the last warm call's tail and from how far the k-th
//! magnitude has fallen between calls ([`WarmStart::learn`]), and a short miss widens it.
//! A selector used on tensors of different shapes keys the start by `(d, k)`; one whose
//! k-th magnitude moves too much (a margin past 25 %), or that keeps missing (tensors of
//! one shape but unrelated values), starts cold for a while.

/// Narrowest margin, relative to the last k-th magnitude.
const MIN_MARGIN: f32 = 1.0 / 512.0;
/// Widest margin. A wider one would put several times `k` above the threshold on a
/// Gaussian tail (5.4 `k` at ρ = 0.01 with this one): a k-th magnitude that moves this
/// much between calls is better served by a fresh estimate, so such a call starts cold.
const MAX_MARGIN: f32 = 0.25;
/// Smallest input that starts warm: below it the cold path needs no sample either.
const MIN_LEN: usize = 1 << 12;
/// Margin of a fresh start.
const START_MARGIN: f32 = 0.125;
/// Most a run of misses widens the estimated margin by.
const MAX_WIDEN: f32 = 16.0;
/// Longest run of cold calls after repeated misses.
const MAX_BACKOFF: u32 = 256;
/// Mean square log change of the k-th magnitude assumed before two calls have shown one
/// (a 2 % move).
const START_STEP: f32 = 4e-4;
/// Narrowest half-width of [`WarmStart::kth_range`], relative.
const MIN_RANGE: f32 = 1.0 / 512.0;

/// The warm-start state of one selector.
#[derive(Debug, Clone)]
pub(crate) struct WarmStart {
    enabled: bool,
    /// `(d, k)` of the last selection, and its k-th magnitude as bits (0: none).
    key: (usize, usize),
    kth: i32,
    /// Relative margin below `kth` of the next warm threshold.
    margin: f32,
    /// The margin that the last warm hit's tail asks for (see [`Self::learn`]).
    tail: f32,
    /// Mean square of the log fall of the k-th magnitude between calls (decaying; rises
    /// count as 0).
    drift: f32,
    /// Factor on the estimated margin, grown by misses and decaying on hits.
    widen: f32,
    /// Mean square of the log change of the k-th magnitude between calls, both ways
    /// (decaying): how far from the last one to look for the next ([`Self::kth_range`]).
    step: f32,
    /// The threshold and candidate count of the current call, when it started warm and
    /// hit (for [`Self::learn`]).
    pending: Option<(i32, usize)>,
    /// Consecutive misses, and the cold calls left before the next warm one.
    misses: u32,
    cold_left: u32,
    /// Warm calls and misses so far (reported by the selectors).
    tally: (u64, u64),
}

impl Default for WarmStart {
    fn default() -> Self {
        WarmStart {
            enabled: true,
            key: (0, 0),
            kth: 0,
            margin: START_MARGIN,
            tail: START_MARGIN,
            drift: 0.0,
            widen: 1.0,
            step: START_STEP,
            pending: None,
            misses: 0,
            cold_left: 0,
            tally: (0, 0),
        }
    }
}

impl WarmStart {
    /// Turns the warm start on or off (off: every call estimates its threshold afresh).
    pub(crate) fn set_enabled(&mut self, on: bool) {
        self.enabled = on;
        self.kth = 0;
    }

    /// The threshold (magnitude bits) to filter a call on `d` elements for `k` from, if
    /// this call starts warm; requires `0 < k < d`.
    pub(crate) fn threshold(&mut self, d: usize, k: usize) -> Option<i32> {
        self.pending = None;
        if !self.enabled || self.kth <= 0 || self.key != (d, k) || d < MIN_LEN {
            return None;
        }
        if self.margin > MAX_MARGIN {
            // Cold calls teach no tail, so the misses' factor decays here too (else a
            // selector widened past the limit would never start warm again).
            self.widen = (self.widen * 0.9).max(1.0);
            return None;
        }
        if self.cold_left > 0 {
            self.cold_left -= 1;
            return None;
        }
        let t = f32::from_bits(self.kth as u32) * (1.0 - self.margin);
        self.tally.0 += 1;
        Some(t.to_bits() as i32)
    }

    /// Where a call's zeroing pass from threshold `t` starts zeroing
    /// ([`crate::kernel::fused_split`]): warm (`warm` is what [`Self::threshold`] gave), at
    /// the last selection's k-th magnitude, what this call most likely selects; cold, at
    /// `t` (every candidate).
    pub(crate) fn zero_from(&self, warm: Option<i32>, t: i32) -> i32 {
        if warm.is_some() {
            t.max(self.kth)
        } else {
            t
        }
    }

    /// Records how the pass of a call went: `warm` is the threshold [`Self::threshold`] gave
    /// (nothing to record when the call started cold), and the pass found `found`
    /// candidates (truncated when `overflow`) where the selection needs at least `need`.
    pub(crate) fn judge(&mut self, warm: Option<i32>, overflow: bool, found: usize, need: usize) {
        match warm {
            Some(_) if overflow || found < need => self.miss(!overflow),
            Some(t) => self.hit(t, found),
            None => {}
        }
    }

    /// A warm call from threshold `t` found `found` candidates for `k` (at least `k`, and
    /// within the cap); [`Self::learn`] sets the next margin from them.
    fn hit(&mut self, t: i32, found: usize) {
        self.misses = 0;
        self.widen = (self.widen * 0.95).max(1.0);
        self.pending = Some((t, found));
    }

    /// A warm call found fewer than `k` candidates (`short`), or more than its cap: the
    /// first widens the margin (from the next [`Self::learn`] on); after repeated misses of
    /// either kind the selector starts cold for a while.
    fn miss(&mut self, short: bool) {
        self.tally.1 += 1;
        if short {
            self.widen = (self.widen * 2.0).min(MAX_WIDEN);
        }
        self.misses += 1;
        if self.misses >= 2 {
            self.cold_left = (1u32 << (self.misses - 1).min(8)).min(MAX_BACKOFF);
        }
    }

    /// Records the k-th magnitude `kth` (bits) of a finished selection of `k` of `d`.
    ///
    /// The next margin is the larger of two, times the factor that misses grew:
    /// - the tail's: after a warm hit, `found` entries at or above `t` and `k` at or above
    ///   `kth`, with counts taken as log-linear in the magnitude between them, put
    ///   `k + 4·√k + k/16` entries above the next threshold if the next input is like this
    ///   one (4·√k covers the count's sampling noise);
    /// - the drift's: four times the root mean square of the k-th magnitude's falls from
    ///   call to call, in log (in training it falls and rises with the loss and the
    ///   learning rate: on ResNet-20 a margin from the tail alone missed one call in seven).
    ///
    /// The margin does not follow a rise: while the residual of error feedback still grows
    /// (its first hundreds of steps) a warm call lets through more candidates than a sample
    /// would. Following the k-th magnitude's trend was tried and dropped: it doubled the
    /// short misses on ResNet-20 and did not make that phase measurably faster.
    pub(crate) fn learn(&mut self, d: usize, k: usize, kth: i32) {
        if !self.enabled {
            return;
        }
        if self.key != (d, k) {
            self.key = (d, k);
            self.margin = START_MARGIN;
            self.tail = START_MARGIN;
            self.drift = 0.0;
            self.widen = 1.0;
            self.step = START_STEP;
            self.misses = 0;
            self.cold_left = 0;
        }
        // A zero k-th magnitude would filter nothing out; an empty selection reports none.
        let finite = 0 < kth && kth < crate::kernel::INF_BITS;
        let kth = if 0 < k && k < d && finite { kth } else { 0 };
        let (last, pending) = (std::mem::replace(&mut self.kth, kth), self.pending.take());
        if kth == 0 {
            return;
        }
        let now = f32::from_bits(kth as u32);
        if last > 0 {
            // Only a fall makes a warm call come up short (a rise adds candidates, up to
            // the cap). A fall by more than 40 % counts as 40 %: a one-off (a learning-rate
            // step) keeps the next few calls cold, not the next forty.
            let change = (now / f32::from_bits(last as u32)).ln().clamp(-0.5, 0.5);
            let fall = change.min(0.0);
            self.drift += (fall * fall - self.drift) / 8.0;
            self.step += (change * change - self.step) / 8.0;
        }
        if let Some((t, found)) = pending {
            let seen = 1.0 - f32::from_bits(t as u32) / now;
            let kf = k as f32;
            let want = (kf + 4.0 * kf.sqrt() + kf / 16.0) / kf;
            self.tail = if found > k && seen > 0.0 {
                seen * want.ln() / (found as f32 / kf).ln()
            } else {
                2.0 * self.tail
            };
        }
        let drift = 1.0 - (-4.0 * self.drift.sqrt()).exp();
        // Past `MAX_MARGIN` the next call starts cold (see [`Self::threshold`]).
        self.margin = (self.tail.max(drift) * self.widen).clamp(MIN_MARGIN, 2.0 * MAX_MARGIN);
    }

    /// Where this call's k-th magnitude most likely lies, as magnitude bits `lo..=hi`, when
    /// it started warm (`warm` is what [`Self::threshold`] gave): the last one, give or
    /// take twice the root mean square of its moves between calls. A guess for
    /// [`crate::order::kth_largest_near`], which checks it. Twice, not three times: on
    /// fresh Gaussian gradients at ρ = 0.01 (2^14 and 2^16) the range held the k-th
    /// magnitude in 96–97 % of the calls and kept 21–34 % of the candidates, against
    /// 99.7 % and 30–48 % (a miss costs one compaction of the list, a wide range a longer
    /// selection).
    pub(crate) fn kth_range(&self, warm: Option<i32>) -> Option<(i32, i32)> {
        if warm.is_none() || self.kth <= 0 {
            return None;
        }
        let half = 2.0 * self.step.sqrt() + MIN_RANGE;
        let last = f32::from_bits(self.kth as u32);
        let bits = |x: f32| x.to_bits() as i32;
        Some((
            bits(last * (1.0 - half).max(0.0)),
            bits(last * (1.0 + half)),
        ))
    }

    /// (warm calls, of which missed) so far.
    pub(crate) fn tally(&self) -> (u64, u64) {
        self.tally
    }

    /// Cap on the candidates of a warm pass for `k` of `d`. Emitting and selecting among
    /// a few times `k` costs less than the cold path's second pass: in the first steps of
    /// error feedback the residual grows, and the k-th magnitude with it (by √2 from the
    /// first step to the second on Gaussian gradients, which puts 11 `k` above the last
    /// threshold at ρ = 0.01). Far more than that means the values changed.
    pub(crate) fn cap(d: usize, k: usize) -> usize {
        k.saturating_mul(16).max(k + 4096).max(d / 16).min(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_adapts_and_backs_off() {
        let bits = |x: f32| x.to_bits() as i32;
        let mut w = WarmStart::default();
        assert_eq!(w.threshold(10_000, 100), None, "cold before any selection");
        w.learn(10_000, 100, bits(2.0));
        let t = w.threshold(10_000, 100).unwrap();
        assert_eq!(f32::from_bits(t as u32), 2.0 * (1.0 - START_MARGIN));
        assert_eq!(
            w.threshold(10_000, 101),
            None,
            "another k is another tensor"
        );
        // 400 candidates from 1.75 up, the k-th at 2.0: the next margin keeps about
        // 100 + 40 + 6 of a tail like this one, a narrower margin.
        let t = w.threshold(10_000, 100).unwrap();
        w.hit(t, 400);
        w.learn(10_000, 100, bits(2.0));
        let want = 0.125 * (1.4625f32).ln() / 4f32.ln();
        assert!(
            (w.margin - want).abs() < 1e-6,
            "{} against {want}",
            w.margin
        );
        // A k-th magnitude that falls by 10 % widens it to the drift's; a rise would not.
        let t = w.threshold(10_000, 100).unwrap();
        w.hit(t, 400);
        w.learn(10_000, 100, bits(2.0 / 1.1));
        let sd = w.drift.sqrt();
        assert!((sd - 1.1f32.ln() / 8f32.sqrt()).abs() < 1e-5, "{sd}");
        assert!(w.margin > want && w.margin == 1.0 - (-4.0 * sd).exp());
        let m = w.margin;
        w.threshold(10_000, 100).unwrap();
        w.miss(true);
        w.learn(10_000, 100, bits(2.0 / 1.1));
        assert!(w.margin > 1.5 * m, "a miss widens: {} after {m}", w.margin);
        assert!(w.threshold(10_000, 100).is_some(), "one miss keeps it warm");
        w.miss(true);
        assert_eq!(w.threshold(10_000, 100), None, "two in a row back off");
        assert_eq!(w.threshold(10_000, 100), None);
        assert!(w.threshold(10_000, 100).is_some());
        assert_eq!(w.tally(), (6, 2));
        w.learn(10_000, 10_000, 1);
        assert_eq!(
            w.threshold(10_000, 10_000),
            None,
            "k = d has nothing to filter"
        );
        w.learn(10_000, 10, i32::MAX);
        assert_eq!(
            w.threshold(10_000, 10),
            None,
            "no k-th magnitude, nothing to start from"
        );
        w.learn(1_000, 10, bits(1.0));
        assert_eq!(w.threshold(1_000, 10), None, "too small to pay");
        // A k-th magnitude that doubles and halves from call to call: cold.
        for i in 0..4 {
            w.learn(10_000, 10, bits(if i % 2 == 0 { 1.0 } else { 2.0 }));
            if i == 0 {
                assert!(w.threshold(10_000, 10).is_some());
            }
        }
        assert!(w.margin > MAX_MARGIN);
        assert_eq!(w.threshold(10_000, 10), None, "too much drift");
        // `judge`: a cold call records nothing; an overflow is a miss that does not widen.
        let mut j = WarmStart::default();
        j.learn(10_000, 10, bits(1.0));
        j.judge(None, true, 0, 10);
        assert_eq!(j.tally(), (0, 0));
        let t = j.threshold(10_000, 10);
        j.judge(t, true, 4096, 10);
        assert_eq!((j.tally(), j.widen), ((1, 1), 1.0));
        let t = j.threshold(10_000, 10);
        j.judge(t, false, 9, 10);
        assert_eq!((j.tally(), j.widen), ((2, 2), 2.0), "short: widens");
        // Misses widened past the limit: steady cold calls bring it back.
        let mut w2 = WarmStart::default();
        w2.learn(10_000, 10, bits(1.0));
        for _ in 0..4 {
            w2.threshold(10_000, 10);
            w2.miss(true);
            w2.cold_left = 0;
        }
        w2.learn(10_000, 10, bits(1.0));
        assert_eq!(w2.threshold(10_000, 10), None, "widened 16×: cold");
        let back = (0..100).find(|_| {
            let warm = w2.threshold(10_000, 10).is_some();
            w2.learn(10_000, 10, bits(1.0));
            warm
        });
        assert!(back.is_some_and(|n| n > 5), "{back:?}");
        w.set_enabled(false);
        w.learn(10_000, 10, bits(1.0));
        assert_eq!(w.threshold(10_000, 10), None);
    }

    /// The range to look for the next k-th magnitude in: only for a warm call, around the
    /// last one, and as wide as its moves have been (both ways).
    #[test]
    fn kth_range_follows_the_moves_both_ways() {
        let bits = |x: f32| x.to_bits() as i32;
        let of = |r: (i32, i32)| (f32::from_bits(r.0 as u32), f32::from_bits(r.1 as u32));
        let mut w = WarmStart::default();
        assert_eq!(w.kth_range(Some(1)), None, "nothing learned yet");
        w.learn(10_000, 100, bits(2.0));
        assert_eq!(w.kth_range(None), None, "a cold call guesses nothing");
        let (lo, hi) = of(w.kth_range(Some(1)).unwrap());
        assert!(lo < 2.0 && hi > 2.0 && hi - 2.0 < 0.2, "{lo}..{hi}");
        // Steady: the range narrows towards its floor.
        for _ in 0..100 {
            w.learn(10_000, 100, bits(2.0));
        }
        let (lo, hi) = of(w.kth_range(Some(1)).unwrap());
        assert!(2.0 - lo < 0.01 && hi - 2.0 < 0.01, "{lo}..{hi}");
        // Rises widen it as falls do.
        let mut up = w.clone();
        let mut down = w.clone();
        for i in 0..20 {
            up.learn(10_000, 100, bits(if i % 2 == 0 { 2.2 } else { 2.0 }));
            down.learn(10_000, 100, bits(if i % 2 == 0 { 2.0 / 1.1 } else { 2.0 }));
        }
        for v in [&up, &down] {
            let (lo, hi) = of(v.kth_range(Some(1)).unwrap());
            assert!(2.0 - lo > 0.2 && hi - 2.0 > 0.2, "{lo}..{hi}");
        }
    }
}
