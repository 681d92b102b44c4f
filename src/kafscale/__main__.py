from kafscale.cli.main import main

raise SystemExit(main())
