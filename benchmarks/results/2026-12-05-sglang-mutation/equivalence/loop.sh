cd /tmp/eqchk
for t in base m121 m149a m149b m151 m155 m180 m148 m178; do
  /work/main/.venv/bin/python mutants.py $t && ./run.sh $t
done
/work/main/.venv/bin/python mutants.py base
for t in m121 m149a m149b m151 m155 m180 m148 m178; do echo "$t: $(/work/main/.venv/bin/python cmp.py base $t)"; done > report.txt
echo finished >> report.txt
