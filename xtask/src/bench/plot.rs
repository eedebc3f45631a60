//! SVG line plots for the report (plotters).

use std::path::Path;

use plotters::prelude::*;

/// One line of a plot.
pub struct Series {
    /// Legend label.
    pub label: String,
    /// Points (x, y); non-positive values are dropped on log axes.
    pub points: Vec<(f64, f64)>,
}

/// Draws `series` into `path` as an SVG line chart with log-log axes when asked.
pub fn lines(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    log_x: bool,
    log_y: bool,
    series: &[Series],
) -> Result<(), Box<dyn std::error::Error>> {
    let keep = |v: f64, log: bool| v.is_finite() && (!log || v > 0.0);
    let pts: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .filter(|&(x, y)| keep(x, log_x) && keep(y, log_y))
        .collect();
    if pts.is_empty() {
        return Ok(());
    }
    let (mut x0, mut x1, mut y0, mut y1) = pts.iter().fold(
        (f64::MAX, f64::MIN, f64::MAX, f64::MIN),
        |(a, b, c, d), &(x, y)| (a.min(x), b.max(x), c.min(y), d.max(y)),
    );
    let widen = |lo: &mut f64, hi: &mut f64, log: bool| {
        if log {
            *lo /= 1.5;
            *hi *= 1.5;
        } else {
            let pad = ((*hi - *lo) * 0.08).max(hi.abs() * 0.05).max(1e-12);
            *lo -= pad;
            *hi += pad;
            if *lo < 0.0 && pts.iter().all(|p| p.1 >= 0.0) {
                *lo = 0.0;
            }
        }
    };
    widen(&mut x0, &mut x1, log_x);
    widen(&mut y0, &mut y1, log_y);
    let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70);
    macro_rules! draw {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_desc(x_label)
                .y_desc(y_label)
                .x_label_formatter(&|v| short(*v))
                .y_label_formatter(&|v| short(*v))
                .draw()?;
            for (i, s) in series.iter().enumerate() {
                let color = Palette99::pick(i).to_rgba();
                let data: Vec<(f64, f64)> = s
                    .points
                    .iter()
                    .copied()
                    .filter(|&(x, y)| keep(x, log_x) && keep(y, log_y))
                    .collect();
                chart
                    .draw_series(LineSeries::new(data.clone(), color.stroke_width(2)))?
                    .label(s.label.clone())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                    });
                chart.draw_series(data.into_iter().map(|p| Circle::new(p, 3, color.filled())))?;
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .position(SeriesLabelPosition::UpperLeft)
                .draw()?;
        }};
    }
    match (log_x, log_y) {
        (true, true) => {
            draw!(builder.build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())?)
        }
        (true, false) => draw!(builder.build_cartesian_2d((x0..x1).log_scale(), y0..y1)?),
        (false, true) => draw!(builder.build_cartesian_2d(x0..x1, (y0..y1).log_scale())?),
        (false, false) => draw!(builder.build_cartesian_2d(x0..x1, y0..y1)?),
    }
    root.present()?;
    Ok(())
}

/// Horizontal bars as a line-free chart: one bar per (label, value).
pub fn bars(
    path: &Path,
    title: &str,
    y_label: &str,
    bars: &[(String, f64)],
) -> Result<(), Box<dyn std::error::Error>> {
    let bars: Vec<&(String, f64)> = bars.iter().filter(|b| b.1.is_finite()).collect();
    if bars.is_empty() {
        return Ok(());
    }
    let max = bars.iter().map(|b| b.1).fold(0.0f64, f64::max).max(1e-12) * 1.15;
    let root = SVGBackend::new(path, (900, 60 + 34 * bars.len() as u32 + 60)).into_drawing_area();
    root.fill(&WHITE)?;
    let n = bars.len();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(160)
        .build_cartesian_2d(0.0..max, (0..n).into_segmented())?;
    chart
        .configure_mesh()
        .x_desc(y_label)
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => bars.get(*i).map(|b| b.0.clone()).unwrap_or_default(),
            _ => String::new(),
        })
        .x_label_formatter(&|v| short(*v))
        .draw()?;
    chart.draw_series(bars.iter().enumerate().map(|(i, b)| {
        let color = Palette99::pick(i).filled();
        Rectangle::new(
            [
                (0.0, SegmentValue::Exact(i)),
                (b.1, SegmentValue::Exact(i + 1)),
            ],
            color,
        )
    }))?;
    root.present()?;
    Ok(())
}

fn short(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if !(1e-3..1e4).contains(&a) {
        format!("{v:.0e}")
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}
