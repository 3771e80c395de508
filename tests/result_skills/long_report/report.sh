#!/bin/sh
rows=$(printf '%s' "$SKILL_INPUT" | sed -n 's/.*"rows": *\([0-9][0-9]*\).*/\1/p')
rows=${rows:-150}
printf '%-6s %-40s %12s %12s %8s\n' "row" "product" "units" "revenue" "margin"
i=1
while [ $i -le "$rows" ]; do
  printf '%-6s %-40s %12s %12s %8s\n' "$i" "product number $i of the catalogue" "$((i * 7))" "$((i * 1234)).00" "$((i % 40))%"
  i=$((i + 1))
done
echo "END OF REPORT"
