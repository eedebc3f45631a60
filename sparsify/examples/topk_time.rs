//! Ad-hoc timing (temporary): interleaved min-of-N ratios to `accumulate`.
use sparsify::*;
use std::time::Instant;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let exps: Vec<u32> = args
        .get(1)
        .map(|s| s.split(',').map(|x| x.parse().unwrap()).collect())
        .unwrap_or(vec![14, 16, 18, 20, 22]);
    let names: Vec<String> = args
        .get(2)
        .map(|s| s.split(',').map(String::from).collect())
        .unwrap_or(vec![
            "exact".into(),
            "mstopk".into(),
            "threshold".into(),
            "gaussiank".into(),
        ]);
    for e in exps {
        let d = 1usize << e;
        let mut s = 7u64.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let g: Vec<f32> = (0..d)
            .map(|_| {
                let mut acc = 0.0f32;
                for _ in 0..4 {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    acc += (s >> 40) as f32 / (1u64 << 24) as f32;
                }
                acc - 2.0
            })
            .collect();
        for rho in std::env::var("RHO")
            .map(|r| vec![r.parse::<f64>().unwrap()])
            .unwrap_or(vec![0.001, 0.01])
        {
            let k = ((d as f64 * rho) as usize).max(1);
            let kth = ExactTopK::new().select(&g, k).unwrap().1.threshold;
            let mut sels: Vec<(String, Box<dyn Selector>, ErrorFeedback)> = names
                .iter()
                .map(|n| {
                    let b: Box<dyn Selector> =
                        match n.trim_end_matches(|c: char| c.is_ascii_digit()) {
                            "threshold" => Box::new(HardThreshold::new(kth).unwrap()),
                            n => n.parse::<SelectorKind>().unwrap().build(1),
                        };
                    (n.clone(), b, ErrorFeedback::new(d))
                })
                .collect();
            if let Ok(n) = std::env::var("ONLY") {
                let (_, sel, ef) = sels.iter_mut().find(|s| s.0 == n).unwrap();
                let t = Instant::now();
                let mut c = 0;
                let mut st = vec![0.0f32; d];
                let mut bs = f64::MAX;
                while t.elapsed().as_secs_f64() < 2.0 {
                    let t0 = Instant::now();
                    accumulate(&mut st, &g).unwrap();
                    bs = bs.min(t0.elapsed().as_secs_f64());
                    ef.reset();
                    let (sg, _) = ef.step(sel.as_mut(), &g, k).unwrap();
                    std::hint::black_box(sg.nnz());
                    c += 1;
                }
                println!("{n} {c} calls, stream min {:.1}us", bs * 1e6);

                continue;
            }
            let reps = if d <= 1 << 18 {
                301
            } else if d <= 1 << 22 {
                41
            } else {
                9
            };
            let mut st = vec![0.0f32; d];
            let mut st2 = vec![0.0f32; d];
            let mut bs2 = f64::INFINITY;
            let mut best = vec![f64::INFINITY; sels.len() + 1];
            for round in 0..=reps {
                let t = Instant::now();
                accumulate(&mut st, &g).unwrap();
                std::hint::black_box(&st);
                if round > 0 {
                    best[0] = best[0].min(t.elapsed().as_secs_f64());
                }
                st2.fill(0.0);
                let t = Instant::now();
                accumulate(&mut st2, &g).unwrap();
                std::hint::black_box(&st2);
                if round > 0 {
                    bs2 = bs2.min(t.elapsed().as_secs_f64());
                }
                for (i, (_, sel, ef)) in sels.iter_mut().enumerate() {
                    ef.reset();
                    let t = Instant::now();
                    let (sg, _) = ef.step(sel.as_mut(), &g, k).unwrap();
                    std::hint::black_box(sg.nnz());
                    drop(sg);
                    if round > 0 {
                        best[i + 1] = best[i + 1].min(t.elapsed().as_secs_f64());
                    }
                }
            }
            let mut line = format!(
                "2^{e} rho {rho}: stream {:.1}us reset-stream {:.2}x",
                best[0] * 1e6,
                bs2 / best[0]
            );
            for (i, (n, _, _)) in sels.iter().enumerate() {
                line += &format!(" {n} {:.2}x", best[i + 1] / best[0]);
            }
            println!("{line}");
        }
    }
}
