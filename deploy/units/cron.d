# Installed by 'agent-wrap install --cron'. See deploy/README.md.
# One agent-wrap watchdog pass a minute over {{Root}}: stops the runs
# whose lease has passed and whose wrapper is gone. Delete this file to undo.
SHELL=/bin/sh
PATH=/usr/bin:/bin
* * * * * {{UserName}} {{Bin}} --root {{Root}} watchdog --once >>{{Log}} 2>&1
