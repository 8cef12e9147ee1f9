//! The run as one picture: every target of every backend, measured against its threshold.
//!
//! Text goes into the SVG as `<text>` elements that the viewer lays out, so drawing needs no
//! font: plotters is built without `ttf`/`ab_glyph` and only estimates label sizes.

use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::report::{Report, TargetCheck};

const SIZE: (u32, u32) = (1000, 560);
/// Bars are cut off here (their label still gives the raw value), so that one
/// far-exceeded target doesn't squash all the others down to the floor.
const CAP: f64 = 3.0;
const MET: RGBColor = RGBColor(46, 160, 67);
const MISSED: RGBColor = RGBColor(207, 34, 46);
/// Room left empty between two backends' groups, in bar slots.
const GAP: f64 = 1.0;

/// Where the measurement stands against its target, as a ratio that is ≥ 1.0 exactly
/// when the target is met, whichever way the target points. This puts targets of
/// very different scales (0.7, 3.0, 5.0) on one axis.
fn score(t: &TargetCheck) -> Result<f64, String> {
    let s = t.target.trim();
    let (lower_is_better, number) = if let Some(n) = s.strip_prefix("<=").or(s.strip_prefix('<')) {
        (true, n)
    } else if let Some(n) = s.strip_prefix(">=").or(s.strip_prefix('>')) {
        (false, n)
    } else {
        return Err(format!("target {:?} of {:?}: no comparison", t.target, t.name));
    };
    let threshold: f64 = number
        .trim()
        .parse()
        .map_err(|e| format!("target {:?} of {:?}: {e}", t.target, t.name))?;
    let ratio = if lower_is_better {
        threshold / t.measured
    } else {
        t.measured / threshold
    };
    // 0/0 and negative figures have no height to draw; x/0 is "far past the target".
    Ok(if ratio.is_nan() { 0.0 } else { ratio.clamp(0.0, CAP) })
}

/// Names hang below the axis in a band of fixed height: a longer one would run into the
/// backend's name.
fn shorten(name: &str) -> String {
    const MAX: usize = 20;
    if name.chars().count() <= MAX {
        return name.to_owned();
    }
    name.chars().take(MAX - 1).chain(['…']).collect()
}

pub fn render_svg(report: &Report) -> Result<String, String> {
    let err = |e: DrawingAreaErrorKind<_>| e.to_string();

    // Each bar gets a slot along x; groups are laid side by side with a gap between.
    struct Bar<'a> {
        x: f64,
        score: f64,
        check: &'a TargetCheck,
    }
    let mut bars = Vec::new();
    let mut groups = Vec::new(); // (backend, first slot, end slot)
    let mut slot = 0.0;
    for b in &report.backends {
        let start = slot;
        for check in &b.targets {
            bars.push(Bar {
                x: slot + 0.5,
                score: score(check)?,
                check,
            });
            slot += 1.0;
        }
        groups.push((b.backend.as_str(), start, slot));
        slot += GAP;
    }
    let width = (slot - GAP).max(1.0);
    // Headroom above the tallest bar for its value label.
    let top = bars.iter().map(|b| b.score).fold(1.5, f64::max) * 1.12;

    let date = report.date.split('T').next().unwrap_or(&report.date);
    let title = "Retrysafe: idempotent write path vs its targets";
    let subtitle = format!(
        "{date} · {} cpus · {}{}",
        report.machine.cpus,
        report.machine.cpu_model,
        if report.quick { " · (quick run)" } else { "" }
    );

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let area = root
            .titled(title, ("sans-serif", 24).into_font().style(FontStyle::Bold))
            .map_err(err)?
            .titled(&subtitle, ("sans-serif", 15).into_font().color(&RGBColor(90, 90, 90)))
            .map_err(err)?;

        let mut chart = ChartBuilder::on(&area)
            .margin(12)
            .margin_top(4)
            // Room on the right for the legend and the dashed line's label.
            .margin_right(80)
            // Room under the axis for the rotated target names and the backend names.
            .x_label_area_size(150)
            .y_label_area_size(56)
            .build_cartesian_2d(0.0..width, 0.0..top)
            .map_err(err)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .disable_x_axis()
            .y_desc("measured against target (≥ 1 is met)")
            .y_label_formatter(&|v| format!("{v:.1}"))
            .axis_desc_style(("sans-serif", 16))
            .label_style(("sans-serif", 15))
            .light_line_style(RGBColor(240, 240, 240))
            .draw()
            .map_err(err)?;

        chart
            .draw_series(bars.iter().map(|b| {
                let color = if b.check.met { MET } else { MISSED };
                Rectangle::new([(b.x - 0.35, 0.0), (b.x + 0.35, b.score)], color.filled())
            }))
            .map_err(err)?;
        // Each bar's own threshold: with the normalised axis it sits at 1.0 on every bar.
        chart
            .draw_series(
                bars.iter()
                    .map(|b| PathElement::new([(b.x - 0.42, 1.0), (b.x + 0.42, 1.0)], BLACK.stroke_width(2))),
            )
            .map_err(err)?;
        chart
            .draw_series([DashedPathElement::new([(0.0, 1.0), (width, 1.0)], 8, 5, BLACK)])
            .map_err(err)?;
        // Labels are placed in pixels, from the chart's coordinates, because they sit
        // outside the plotting area (names, backends) or at a fixed offset from a bar.
        let font = |size, color: RGBColor, h, v| {
            ("sans-serif", size)
                .into_font()
                .color(&color)
                .into_text_style(&root)
                .pos(Pos::new(h, v))
        };
        let axis_y = chart.backend_coord(&(0.0, 0.0)).1;
        let (right, target_y) = chart.backend_coord(&(width, 1.0));
        root.draw_text(
            "target",
            &font(16, BLACK, HPos::Left, VPos::Center),
            (right + 6, target_y),
        )
        .map_err(err)?;
        // The legend goes in the right margin, where no bar can be under it.
        let top_y = chart.backend_coord(&(width, top)).1;
        for (i, (label, color)) in [("met", MET), ("missed", MISSED)].into_iter().enumerate() {
            let (x, y) = (right + 10, top_y + 12 + 24 * i as i32);
            root.draw(&Rectangle::new([(x, y - 7), (x + 14, y + 7)], color.filled()))
                .map_err(err)?;
            root.draw_text(label, &font(16, BLACK, HPos::Left, VPos::Center), (x + 20, y))
                .map_err(err)?;
        }
        let hanging = |color| font(14, color, HPos::Right, VPos::Center).transform(FontTransform::Rotate270);
        for b in &bars {
            // A bar short of its target would have its value on the threshold line: lift it over.
            let (x, y) = chart.backend_coord(&(b.x, b.score.max(1.0)));
            let value = format!("{:.2}", b.check.measured);
            root.draw_text(&value, &font(15, BLACK, HPos::Center, VPos::Bottom), (x, y - 4))
                .map_err(err)?;
            // Name and target hang below the axis side by side, read bottom to top.
            root.draw_text(&shorten(&b.check.name), &hanging(BLACK), (x - 8, axis_y + 6))
                .map_err(err)?;
            root.draw_text(&b.check.target, &hanging(RGBColor(110, 110, 110)), (x + 8, axis_y + 6))
                .map_err(err)?;
        }
        let bold = ("sans-serif", 20)
            .into_font()
            .style(FontStyle::Bold)
            .into_text_style(&root)
            .pos(Pos::new(HPos::Center, VPos::Bottom));
        for (backend, start, end) in &groups {
            let (left, _) = chart.backend_coord(&(*start, 0.0));
            let (right, _) = chart.backend_coord(&(*end, 0.0));
            let y = SIZE.1 as i32 - 8;
            let rule = PathElement::new([(left + 4, y - 22), (right - 4, y - 22)], RGBColor(150, 150, 150));
            root.draw(&rule).map_err(err)?;
            root.draw_text(backend, &bold, ((left + right) / 2, y)).map_err(err)?;
        }
        root.present().map_err(err)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(target: &str, measured: f64) -> TargetCheck {
        TargetCheck {
            name: "x".into(),
            target: target.into(),
            measured,
            met: false,
        }
    }

    #[test]
    fn score_is_at_least_one_exactly_when_met() {
        assert_eq!(score(&check(">= 0.70", 0.84)).unwrap(), 1.2);
        assert_eq!(score(&check("<= 1.40", 0.70)).unwrap(), 2.0);
        assert_eq!(score(&check("< 5.00", 10.0)).unwrap(), 0.5);
        assert_eq!(score(&check(">= 3.00", 300.0)).unwrap(), CAP);
        assert_eq!(score(&check("< 5.00", 0.0)).unwrap(), CAP);
        assert!(score(&check("about 5", 1.0)).is_err());
    }

    #[test]
    fn long_names_are_shortened() {
        assert_eq!(shorten("replay rps"), "replay rps");
        assert_eq!(shorten("idempotent create p50 ratio").chars().count(), 20);
    }
}
