//! Bar charts of a study table, normalized to the baseline path as seed 003's figures are:
//! the rate on the left, total CPU per unit on the right, a group of bars per connection
//! count, one bar per path, the baseline at 1.0. PNG, with the DejaVu Sans font compiled
//! into the binary so the chart looks the same on any host.

use std::path::Path;
use std::sync::Once;

use crate::error::Result;
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

use super::table::{Table, Values, ratio};

static FONT: Once = Once::new();

pub fn font() {
    FONT.call_once(|| {
        // Fails only for a font that does not parse; the bytes are ours and do.
        let _ = register_font("sans-serif", FontStyle::Normal, include_bytes!("../assets/DejaVuSans.ttf"));
    });
}

pub const COLORS: [RGBColor; 12] = [
    RGBColor(0x4c, 0x72, 0xb0),
    RGBColor(0xdd, 0x84, 0x52),
    RGBColor(0x55, 0xa8, 0x68),
    RGBColor(0xc4, 0x4e, 0x52),
    RGBColor(0x81, 0x72, 0xb3),
    RGBColor(0x93, 0x78, 0x60),
    RGBColor(0xda, 0x8b, 0xc3),
    RGBColor(0x8c, 0x8c, 0x8c),
    RGBColor(0xcc, 0xb9, 0x74),
    RGBColor(0x64, 0xb5, 0xcd),
    RGBColor(0x2f, 0x4b, 0x7c),
    RGBColor(0x9c, 0x3d, 0x3d),
];

/// Draws `t` to `file` (PNG, 1200×480).
pub fn draw(t: &Table, file: &Path) -> Result<()> {
    font();
    let root = BitMapBackend::new(file, (1200, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| sluice_sys::failure!("{e}"))?;
    let title = format!("{} — MTU {}, {} — normalized to {}", t.workload, t.mtu, t.family, t.baseline);
    let root = root.titled(&title, ("sans-serif", 22)).map_err(|e| sluice_sys::failure!("{e}"))?;
    let (left, right) = root.split_horizontally(600);
    panel(&left, t, &format!("{} (higher is better)", t.rate_label()), &|v: &Values| v.rate.median)?;
    panel(&right, t, &format!("{} total (lower is better)", t.cpu_label()), &|v: &Values| v.cpu[3].median)?;
    root.present().map_err(|e| sluice_sys::failure!("{e}"))?;
    Ok(())
}

fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    t: &Table,
    caption: &str,
    f: &dyn Fn(&Values) -> f64,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let groups = t.conns.len();
    let npaths = t.rows.len().max(1);
    // ratio[path][group]
    let ratios: Vec<Vec<Option<f64>>> = t
        .rows
        .iter()
        .map(|row| {
            row.values
                .iter()
                .enumerate()
                .map(|(i, v)| match (v, t.base(row, i)) {
                    (Some(v), Some(b)) => ratio(f(v), f(b)),
                    _ => None,
                })
                .collect()
        })
        .collect();
    // Headroom above the tallest bar for the legend (about 18 px a line of a 380-px plot).
    let tallest = ratios.iter().flatten().flatten().fold(1.0f64, |a, &b| a.max(b));
    let legend = (18.0 * npaths as f64 / 380.0).min(0.7);
    let top = tallest * (1.25 + 0.06 * npaths as f64).max(1.1 / (1.0 - legend));
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 17))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(48)
        .build_cartesian_2d(0f64..groups as f64, 0f64..top)
        .map_err(|e| sluice_sys::failure!("{e}"))?;
    let conns = t.conns.clone();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .light_line_style(RGBColor(236, 236, 236))
        .x_labels(groups * 2 + 1)
        .x_label_formatter(&|x| {
            let i = (x - 0.5).round();
            if (x - 0.5 - i).abs() < 0.01 && i >= 0.0 && (i as usize) < conns.len() {
                let n = conns[i as usize];
                format!("{n} conn{}", if n == 1 { "" } else { "s" })
            } else {
                String::new()
            }
        })
        .y_desc("ratio to baseline")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| sluice_sys::failure!("{e}"))?;
    let width = 0.8 / npaths as f64;
    for (p, row) in t.rows.iter().enumerate() {
        let label = row.label(t.conditions);
        let color = COLORS[p % COLORS.len()];
        let bars: Vec<(f64, f64)> = ratios[p]
            .iter()
            .enumerate()
            .filter_map(|(g, r)| r.map(|r| (g as f64 + 0.1 + p as f64 * width, r)))
            .collect();
        chart
            .draw_series(bars.iter().map(|&(x, r)| Rectangle::new([(x, 0.0), (x + width * 0.92, r)], color.filled())))
            .map_err(|e| sluice_sys::failure!("{e}"))?
            .label(label.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled()));
        chart
            .draw_series(bars.iter().map(|&(x, r)| {
                Text::new(
                    format!("{r:.2}"),
                    (x + width * 0.2, r + top * 0.025),
                    ("sans-serif", 12).into_font().color(&BLACK),
                )
            }))
            .map_err(|e| sluice_sys::failure!("{e}"))?;
    }
    chart
        .draw_series(std::iter::once(PathElement::new(vec![(0.0, 1.0), (groups as f64, 1.0)], BLACK.stroke_width(1))))
        .map_err(|e| sluice_sys::failure!("{e}"))?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(|e| sluice_sys::failure!("{e}"))?;
    Ok(())
}
