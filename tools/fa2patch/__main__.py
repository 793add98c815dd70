# SPDX-License-Identifier: BSD-3-Clause
from fa2patch.cli.main import main

main()
