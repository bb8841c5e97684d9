// A line chart on a <canvas>, drawn here: values over a UTC time axis (the put rate
// of a topic, a group's figures). No library: a tick every 15 s, 1 min, ... (at most
// about 10 in the window), a "nice" value scale.

const TICKS_MS = [15_000, 30_000, 60_000, 120_000, 300_000, 600_000, 1_800_000, 3_600_000];
const PAD = { left: 48, right: 30, top: 16, bottom: 26 };

function niceMax(value) {
  if (value <= 0) return 1;
  const step = 10 ** Math.floor(Math.log10(value));
  for (const m of [1, 2, 5, 10]) if (m * step >= value) return m * step;
  return 10 * step;
}

/** Draw points [{t, v}] (t in ms since the epoch) from end - windowMs to end. */
export function drawLine(canvas, points, end, windowMs, unit) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || 480;
  const height = canvas.clientHeight || 180;
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  const g = canvas.getContext("2d");
  g.setTransform(ratio, 0, 0, ratio, 0, 0);
  g.clearRect(0, 0, width, height);
  const begin = end - windowMs;
  const top = niceMax(Math.max(0, ...points.map((p) => p.v)) * 1.1);
  const x = (t) => PAD.left + ((t - begin) / windowMs) * (width - PAD.left - PAD.right);
  const y = (v) => height - PAD.bottom - (v / top) * (height - PAD.top - PAD.bottom);
  g.font = "11px system-ui, sans-serif";
  g.strokeStyle = "#d5dbe3";
  g.fillStyle = "#5d6b7e";
  g.lineWidth = 1;
  g.textAlign = "right";
  g.textBaseline = "middle";
  for (const v of [0, top / 2, top]) {
    g.beginPath();
    g.moveTo(PAD.left, y(v));
    g.lineTo(width - PAD.right, y(v));
    g.stroke();
    g.fillText(String(Math.round(v * 10) / 10), PAD.left - 6, y(v));
  }
  g.textAlign = "center";
  g.textBaseline = "top";
  const tick = TICKS_MS.find((ms) => windowMs / ms <= 10) ?? TICKS_MS[TICKS_MS.length - 1];
  for (let t = Math.ceil(begin / tick) * tick; t <= end; t += tick) {
    g.beginPath();
    g.moveTo(x(t), height - PAD.bottom);
    g.lineTo(x(t), height - PAD.bottom + 4);
    g.stroke();
    g.fillText(new Date(t).toISOString().slice(11, 19), x(t), height - PAD.bottom + 6);
  }
  g.textAlign = "left";
  g.fillText(`UTC · ${unit}`, PAD.left, 0);
  const shown = points.filter((p) => p.t >= begin);
  g.strokeStyle = "#1f6feb";
  g.fillStyle = "#1f6feb";
  g.lineWidth = 2;
  g.beginPath();
  shown.forEach((p, i) => (i ? g.lineTo(x(p.t), y(p.v)) : g.moveTo(x(p.t), y(p.v))));
  g.stroke();
  for (const p of shown) g.fillRect(x(p.t) - 1.5, y(p.v) - 1.5, 3, 3);
}
