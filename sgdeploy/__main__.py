from sgdeploy.cli import main

raise SystemExit(main())
