# SPDX-License-Identifier: BSD-3-Clause
"""The Nelder-Mead simplex search calibration.py fits with (a few parameters, a smooth cost)."""


def nelder_mead(f, x0: list[float], step: list[float], tol: float = 1e-7, iterations: int = 400) -> list[float]:
    """Minimise ``f`` from ``x0`` (the standard reflection / expansion / contraction / shrink)."""
    points = [list(x0)] + [[x + (s if i == j else 0.0) for j, x in enumerate(x0)] for i, s in enumerate(step)]
    values = [f(p) for p in points]
    for _ in range(iterations):
        order = sorted(range(len(points)), key=values.__getitem__)
        points, values = [points[i] for i in order], [values[i] for i in order]
        if values[-1] - values[0] < tol:
            break
        centre = [sum(c) / (len(points) - 1) for c in zip(*points[:-1], strict=True)]
        worst = points[-1]
        reflected = _toward(centre, worst, -1.0)
        fr = f(reflected)
        if fr < values[0]:
            expanded = _toward(centre, worst, -2.0)
            fe = f(expanded)
            points[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            points[-1], values[-1] = reflected, fr
        else:
            inner = _toward(centre, worst, 0.5)
            fi = f(inner)
            if fi < values[-1]:
                points[-1], values[-1] = inner, fi
            else:
                points = [points[0]] + [
                    [b + 0.5 * (p - b) for b, p in zip(points[0], q, strict=True)] for q in points[1:]
                ]
                values = [values[0]] + [f(p) for p in points[1:]]
    return points[min(range(len(points)), key=values.__getitem__)]


def _toward(centre: list[float], worst: list[float], t: float) -> list[float]:
    """The point ``t`` of the way from ``centre`` to ``worst`` (t < 0: beyond the centre, away from it)."""
    return [c + t * (w - c) for c, w in zip(centre, worst, strict=True)]
