from kafscale.ops.cli import main

raise SystemExit(main())
