"""The HTML report's Roofline section for an image workload: one point per stack at its denoising step's
intensity (FLOPs from the model's shape), images/s columns, the fraction of the images/s ceiling; the LLM
section's decode-step point does not apply (issue 16)."""

import re

import pytest

from inferloom.measure.diffusion_costs import diffusion_costs, image_roofline
from inferloom.report.html import render_html
from test_report_html import CEILINGS, _cited, _section, assert_self_contained, full_breakdown, parse


def _img_roof(images_per_s):
    costs = diffusion_costs("sd3-tiny", 32, 32, 1, True, 4)
    return image_roofline(CEILINGS, costs, 2, images_per_s)


def _image_breakdown():
    b = full_breakdown()
    stock_r, final_r = _img_roof(3.1), _img_roof(4.4)
    b["roofline"] = {"ceilings": CEILINGS, "stock": stock_r, "final": final_r, "amdahl": None,
                     "kept": [{"trial": 2, "cycle": 1, "changes": {"dtype": "bfloat16"}, "roofline": final_r,
                               "ledger_seq": 31}],
                     "ledger_seqs": [30, 31, 32], "stock_seq": 30, "final_seq": 32}
    return b, stock_r, final_r


def test_an_image_sessions_roofline_is_drawn_per_denoising_step():
    b, stock_r, final_r = _image_breakdown()
    page = render_html(b)
    parse(page)
    assert_self_contained(page)
    roof = _section(page, "roofline")
    assert roof.count("<svg") == 1 and "denoising steps" in roof and "decode steps" not in roof
    assert ">stock<" in roof and ">final<" in roof and ">after trial 2<" in roof and _cited(roof, 31)
    assert "measured images/s" in roof and "ceiling images/s" in roof and "tok/s" not in roof
    assert "32x32, 2 steps, batch 1, classifier-free guidance" in roof
    assert f"{stock_r['fraction'] * 100:.1f}%" in roof and f"{final_r['fraction'] * 100:.1f}%" in roof
    # the stock point: achieved FLOP/s = images/s / batch x steps x FLOPs per step, at the step's intensity
    step = stock_r["denoise_step"]
    ai = step["flops"] / step["bytes"]
    tips = re.findall(r"<title>stock: ([0-9.e+]+) FLOP/B, ([^<]*) per denoising step", roof)
    assert tips and float(tips[0][0]) == pytest.approx(ai, rel=1e-2)


def test_an_image_session_without_a_measured_point_still_says_so():
    b, stock_r, _ = _image_breakdown()
    b["roofline"]["final"] = None
    b["roofline"]["kept"] = []
    page = render_html(b)
    parse(page)
    roof = _section(page, "roofline")
    assert "No final-stack point" in roof and ">stock<" in roof
    unmeasured = dict(stock_r, measured_images_per_s=None, fraction=None)
    b["roofline"]["stock"] = unmeasured
    roof = _section(render_html(b), "roofline")
    assert "<svg" not in roof and "ceiling images/s" in roof  # no point to plot without a measurement
    assert "<td class=\"num\">—</td>" in roof  # its fraction is unknown, not 0%
