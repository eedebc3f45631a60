//! A Gantt chart of a [`Timeline`] as SVG: one row for backward (per layer), one for sparsification
//! and one for communication (per group), as OMGS-SGD (Shi et al., INFOCOM 2020) Fig. 1 draws them.

use plotters::prelude::*;

use crate::timeline::{Span, Timeline};
use crate::{Error, Result};

fn plot_err<E: std::fmt::Display>(e: E) -> Error {
    Error::Plot(e.to_string())
}

const ROWS: [&str; 4] = ["comm", "sparsify", "backward", "forward"];

/// Renders `timeline` as an SVG document titled `title`.
pub fn gantt_svg(timeline: &Timeline, title: &str) -> Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1000, 320)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let t_max = timeline.iteration_s.max(1e-9) * 1.02;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(80)
            .build_cartesian_2d(0.0..t_max * 1e3, 0.0..4.0)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .x_desc("time (ms)")
            .y_labels(8)
            .y_label_formatter(&|y: &f64| {
                let i = (*y - 0.5).round();
                if (y - (i + 0.5)).abs() < 1e-6 && (0.0..4.0).contains(&i) {
                    ROWS[i as usize].to_string()
                } else {
                    String::new()
                }
            })
            .draw()
            .map_err(plot_err)?;
        // Every bar in drawing order: forward, backward per layer, then per group the
        // selections, the communication and its outline.
        let bar = |row: f64, span: &Span, style: ShapeStyle| {
            Rectangle::new(
                [(span.start * 1e3, row + 0.1), (span.end * 1e3, row + 0.9)],
                style,
            )
        };
        let palette = [RGBColor(66, 133, 244), RGBColor(120, 170, 250)];
        let groups = &timeline.groups;
        let mut bars = vec![bar(
            3.0,
            &timeline.forward,
            RGBColor(180, 180, 180).filled(),
        )];
        bars.extend(
            timeline
                .backward
                .iter()
                .enumerate()
                .map(|(l, s)| bar(2.0, s, palette[l % 2].filled())),
        );
        bars.extend(
            groups
                .iter()
                .map(|g| bar(1.0, &g.sparsify, RGBColor(251, 188, 5).filled())),
        );
        bars.extend(
            groups
                .iter()
                .map(|g| bar(0.0, &g.comm, RGBColor(52, 168, 83).filled())),
        );
        bars.extend(
            groups
                .iter()
                .map(|g| bar(0.0, &g.comm, BLACK.stroke_width(1))),
        );
        chart.draw_series(bars).map_err(plot_err)?;
        root.present().map_err(plot_err)?;
    }
    Ok(svg)
}

/// Writes [`gantt_svg`] to `path`.
pub fn write_gantt(
    timeline: &Timeline,
    title: &str,
    path: impl AsRef<std::path::Path>,
) -> Result<()> {
    let svg = gantt_svg(timeline, title)?;
    std::fs::write(path.as_ref(), svg)
        .map_err(|e| Error::Io(format!("{}: {e}", path.as_ref().display())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{predict, LayerProfile, MergePlan, SimpleCosts};

    #[test]
    fn draws_an_svg() {
        let p = LayerProfile::from_sizes("m", &[100, 2000, 30])
            .unwrap()
            .scaled(1.0)
            .unwrap();
        let p = p.with_backward_times(0.01, &[0.01, 0.02, 0.005]).unwrap();
        let c = SimpleCosts {
            gamma: 1e-6,
            alpha: 0.01,
            beta: 1e-6,
        };
        let t = predict(&p, &MergePlan::layerwise(3), &c).unwrap();
        let svg = gantt_svg(&t, "test").unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("</svg>"));
    }
}
