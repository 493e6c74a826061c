# Revenue by region from sales.csv: a table on stdout, a CSV and a chart as artifacts.
import pandas as pd
import matplotlib.pyplot as plt

df = pd.read_csv("sales.csv", parse_dates=["date"])
df["revenue"] = df["units"] * df["unit_price"]

by_region = df.groupby("region")["revenue"].sum().sort_values(ascending=False)
print("Revenue by region")
print(by_region.to_string())
print(f"\nTotal revenue: {df['revenue'].sum():.2f} over {len(df)} orders")

by_region.to_csv("revenue_by_region.csv", header=["revenue"])

fig, ax = plt.subplots(figsize=(6, 4))
by_region.plot.bar(ax=ax, color="#4C72B0")
ax.set_title("Revenue by region")
ax.set_ylabel("revenue")
fig.tight_layout()
fig.savefig("revenue_by_region.png", dpi=100)
plt.close(fig)  # a figure left open would also come back as figure-1.png
