# SPDX-License-Identifier: BSD-3-Clause
from .cli import main

main()
