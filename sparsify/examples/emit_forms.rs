//! Times one selector with error feedback in each emission form ([`sparsify::EmitForm`]) on
//! a fresh gradient every call, in turns within each round so that every form sees the same
//! machine, and prints each form's median ratio to the `r += g` floor of that round.
//!
//! A fresh gradient matters: timed on the same input again and again, the branch predictor
//! learns the hit tests' outcomes and hides what they cost on real, changing gradients.
//!
//! `cargo run --release -p sparsify --example emit_forms -- [log2 d] [density] [selector] [rounds]`
//! (defaults: 16 0.01 exact 400).

use std::time::Instant;

use sparsify::{set_emit_form, EmitForm, ErrorFeedback, Selector, SelectorKind};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let e: u32 = args.first().map_or(Ok(16), |a| a.parse())?;
    let density: f64 = args.get(1).map_or(Ok(0.01), |a| a.parse())?;
    let kind: SelectorKind = args.get(2).map_or("exact", |a| a.as_str()).parse()?;
    let rounds: usize = args.get(3).map_or(Ok(400), |a| a.parse())?;
    if e > 28 || !(0.0..=1.0).contains(&density) || rounds < 4 {
        return Err("want log2 d ≤ 28, density in [0, 1] and at least 4 rounds".into());
    }
    let d = 1usize << e;
    let k = ((d as f64 * density) as usize).max(1);
    let forms = [
        EmitForm::Adaptive,
        EmitForm::Branchy,
        EmitForm::BranchFree,
        EmitForm::Dense,
    ];
    let mut cases: Vec<(Box<dyn Selector>, ErrorFeedback)> = forms
        .iter()
        .map(|_| (kind.build(1), ErrorFeedback::new(d)))
        .collect();
    let mut grad = vec![0.0f32; d];
    let mut floor = vec![0.0f32; d];
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut ratios = vec![Vec::with_capacity(rounds); forms.len()];
    for round in 0..rounds {
        // A new draw every round (sum of four uniforms: bell-shaped), untimed.
        for v in grad.iter_mut() {
            let mut acc = 0.0f32;
            for _ in 0..4 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                acc += (state >> 40) as f32 / (1u64 << 24) as f32;
            }
            *v = acc - 2.0;
        }
        let t = Instant::now();
        sparsify::accumulate(&mut floor, &grad)?;
        std::hint::black_box(&floor);
        let stream = t.elapsed().as_secs_f64();
        for j in 0..forms.len() {
            let f = (j + round) % forms.len();
            set_emit_form(forms[f]);
            let (sel, ef) = &mut cases[f];
            ef.reset();
            let t = Instant::now();
            let (sg, _) = ef.step(sel.as_mut(), &grad, k)?;
            let took = t.elapsed().as_secs_f64();
            sel.recycle(sg);
            // The first rounds warm the buffers and the warm start up.
            if round >= 3 {
                ratios[f].push(took / stream);
            }
        }
    }
    set_emit_form(EmitForm::Adaptive);
    println!("d = 2^{e}, k = {k}, {kind}: median ratio to the r += g floor, fresh gradients");
    for (f, r) in forms.iter().zip(&mut ratios) {
        r.sort_by(|a, b| a.total_cmp(b));
        println!("  {f:?}: {:.2}×", r[r.len() / 2]);
    }
    Ok(())
}
